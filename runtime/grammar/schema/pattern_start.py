"""The characters a pattern's matches can start with: enough for ``oneof.py`` to prove two
anchored string patterns disjoint (``^success$`` / ``^fail$``, ``^[A-Za-z]...`` / ``^~...``)
without deciding regex intersection in general."""
from __future__ import annotations

import re

try:  # the parser behind ``re``
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python < 3.11
    import sre_parse as _sre_parse  # type: ignore[no-redef]


def first_chars(pattern: str) -> list[tuple[int, int]] | None:
    """The code point ranges a string matching ``pattern`` (search semantics) can start with,
    when the pattern is anchored with ``^`` and begins with literals or plain classes; None
    when unknown (a match may then start with anything)."""
    try:
        parsed = _sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError, TypeError):
        return None
    items = list(parsed)
    if parsed.state.flags & (re.IGNORECASE | re.MULTILINE) or \
            not items or items[0] != (_sre_parse.AT, _sre_parse.AT_BEGINNING):
        return None
    return _first(items[1:])


def _first(items: list) -> list[tuple[int, int]] | None:
    if not items:
        return None  # the empty string (or anything, unanchored) may match
    op, av = items[0]
    if op is _sre_parse.LITERAL:
        return [(av, av)]
    if op is _sre_parse.IN:
        ranges = [(v, v) if o is _sre_parse.LITERAL else v for o, v in av
                  if o in (_sre_parse.LITERAL, _sre_parse.RANGE)]
        return ranges if len(ranges) == len(av) else None  # NEGATE, categories: unknown
    if op in (_sre_parse.MAX_REPEAT, _sre_parse.MIN_REPEAT):
        return _first(list(av[2])) if av[0] >= 1 else None
    if op is _sre_parse.SUBPATTERN:
        return None if av[1] else _first(list(av[3]))  # a group setting flags: unknown
    if op is _sre_parse.BRANCH:
        alts = [_first(list(alt)) for alt in av[1]]
        return None if None in alts else [r for alt in alts for r in alt]
    return None


def starts_disjoint(a: str, b: str) -> bool:
    """True if no string matching ``a`` starts like one matching ``b`` (False: unknown)."""
    fa, fb = first_chars(a), first_chars(b)
    return fa is not None and fb is not None and not any(
        x_lo <= y_hi and y_lo <= x_hi for x_lo, x_hi in fa for y_lo, y_hi in fb)

"""The strings a ``pattern`` matches, listed when they are few (``arrays.py``: ``uniqueItems``
over items of a finite domain, like ``^[ab]$``).

Both backends match a pattern against the whole string (``strings.py``), so the list is of the
whole matches: anchors match the empty string. Only the part of the regex language
``patterns.py`` reads alike in every dialect is listed (it parses first); of that, ``.``, a
negated class and class escapes other than ``\\d`` (``[0-9]`` in ECMA-262 and in the backends,
any Unicode digit in Python) make the language too large to list, as does an unbounded repeat.
"""
from __future__ import annotations

import itertools
from typing import Any

from .patterns import Unfoldable, parse_pattern

try:  # the parser behind ``re``: its tree is what gets listed
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python < 3.11
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_C = _sre_parse
_DIGITS = [str(d) for d in range(10)]


class _TooMany(Exception):
    pass


def pattern_values(pattern: str, cap: int) -> list[str] | None:
    """The strings ``pattern`` fully matches, in the order the pattern spells them; None if
    there are over ``cap`` of them (or infinitely many) or the pattern is outside the dialect."""
    try:
        if parse_pattern(pattern).width[1] is None:
            return None
        return _seq(_sre_parse.parse(pattern), cap)
    except (Unfoldable, _TooMany):
        return None


def _seq(items: Any, cap: int) -> list[str]:
    out = [""]
    for op, arg in items:
        out = _distinct((a + b for a, b in itertools.product(out, _one(op, arg, cap))), cap)
    return out


def _one(op: Any, arg: Any, cap: int) -> list[str]:
    if op is _C.LITERAL:
        return [chr(arg)]
    if op is _C.AT and arg in (_C.AT_BEGINNING, _C.AT_BEGINNING_STRING, _C.AT_END,
                               _C.AT_END_STRING):
        return [""]  # a whole-string match: anchors add nothing
    if op is _C.IN:
        return _class(arg, cap)
    if op is _C.BRANCH:
        return _distinct((s for branch in arg[1] for s in _seq(branch, cap)), cap)
    if op is _C.SUBPATTERN and not arg[1] and not arg[2]:  # no inline flags
        return _seq(arg[3], cap)
    if op in (_C.MAX_REPEAT, _C.MIN_REPEAT) and arg[1] != _C.MAXREPEAT:
        lo, hi, body = arg
        return _distinct((s for k in range(lo, hi + 1) for s in _seq(list(body) * k, cap)), cap)
    raise _TooMany  # any character, a negated class, a reference: not listed


def _class(items: Any, cap: int) -> list[str]:
    out: list[str] = []
    for op, arg in items:
        if op is _C.LITERAL:
            out.append(chr(arg))
        elif op is _C.RANGE and arg[1] - arg[0] < cap:
            out += [chr(c) for c in range(arg[0], arg[1] + 1)]
        elif op is _C.CATEGORY and arg is _C.CATEGORY_DIGIT:
            out += _DIGITS
        else:
            raise _TooMany
    return _distinct(out, cap)


def _distinct(strings: Any, cap: int) -> list[str]:
    out: dict[str, None] = {}
    for s in strings:
        out[s] = None
        if len(out) > cap:
            raise _TooMany
    return list(out)

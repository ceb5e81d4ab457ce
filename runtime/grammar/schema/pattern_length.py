"""Length bounds folded into a ``pattern`` exactly: the regex ``fold_lengths`` returns fully
matches the strings that fully match the pattern *and* have ``lo <= len <= hi`` code points.

xgrammar ignores ``minLength``/``maxLength`` beside a ``pattern``, so the bounds must live in the
regex. The pattern is parsed into atoms of width one (literal, class, escape, ``.``), groups,
alternations and quantifiers (``patterns.py``), then spelled as a union of *shapes*: sequences of
fixed-width pieces (kept verbatim) and repeats ``X{a,b}`` of a fixed-width atom ``X``.
Alternations and bounded repeats of variable-width groups are multiplied out into shapes, but only
where the pattern's width is not already within the bounds. A shape's length is then
``fixed + w*k`` for its one repeat's count ``k``, so clamping ``k`` is exact; a shape with several
repeats has all but the widest enumerated (when few). Anything else (an unbounded repeat of a
variable-width group, too many shapes) raises ``Unfoldable`` and the caller rejects the schema.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

from .patterns import Node, Unfoldable, parse_pattern

try:  # the parser behind ``re``: counts a pattern's bounded repeats
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python < 3.11
    import sre_parse as _sre_parse  # type: ignore[no-redef]

MAX_SHAPES = 32  # alternatives one folded pattern may spell out
_REPEATS = (_sre_parse.MAX_REPEAT, _sre_parse.MIN_REPEAT)


@dataclass(frozen=True)
class Piece:
    """Fixed text of width ``w`` (``hi`` None), or ``text`` repeated ``lo..hi`` times (``hi``
    None: unbounded) where ``text`` has width ``w``."""
    text: str
    w: int
    lo: int = 1
    hi: int | None = 1
    var: bool = False

    def spelled(self, lo: int, hi: int | None) -> str:
        if not self.var:
            return self.text
        if lo == hi:
            return "" if lo == 0 else self.text if lo == 1 else f"{self.text}{{{lo}}}"
        return f"{self.text}{{{lo},{'' if hi is None else hi}}}"


Shape = tuple[Piece, ...]


def fold_lengths(pattern: str, lo: int, hi: int | None) -> str | None:
    """An anchored regex for ``fullmatch(pattern) and lo <= len <= hi`` (None: no string is
    both), or the pattern itself when its widths already lie within the bounds."""
    tree = parse_pattern(pattern)
    if _within(tree.width, lo, hi):
        return pattern
    texts: list[str] = []
    for shape in _shapes(tree):
        texts += _clamp(shape, lo, hi)
    texts = list(dict.fromkeys(texts))
    if not texts:
        return None
    if len(texts) > MAX_SHAPES:
        raise Unfoldable(f"it spells out to over {MAX_SHAPES} alternatives")
    return f"^{texts[0]}$" if len(texts) == 1 else f"^({'|'.join(texts)})$"


def _within(width: tuple[int, int | None], lo: int, hi: int | None) -> bool:
    return width[0] >= lo and (hi is None or (width[1] is not None and width[1] <= hi))


def _shapes(node: Node) -> list[Shape]:
    """``node`` as a union of shapes (fixed-width subtrees stay whole, as written)."""
    w_lo, w_hi = node.width
    if w_lo == w_hi:
        return [(Piece(node.atom_text(), w_lo),)]
    if node.kind == "group":
        return _shapes(node.children[0])
    if node.kind == "alt":
        return _capped([s for child in node.children for s in _shapes(child)])
    if node.kind == "seq":
        return _product([_shapes(child) for child in node.children])
    inner = node.children[0]  # a repeat
    if inner.width[0] == inner.width[1]:
        return [(Piece(inner.atom_text(), inner.width[0], node.lo, node.hi, True),)]
    if node.hi is None:
        raise Unfoldable("a variable-width group repeated without bound")
    once = _shapes(inner)
    return _capped([s for k in range(node.lo, node.hi + 1) for s in _product([once] * k)])


def _product(parts: list[list[Shape]]) -> list[Shape]:
    out: list[Shape] = [()]
    for options in parts:
        out = _capped([a + b for a in out for b in options])
    return out


def _capped(shapes: list[Shape]) -> list[Shape]:
    if len(shapes) > MAX_SHAPES:
        raise Unfoldable(f"it spells out to over {MAX_SHAPES} alternatives")
    return shapes


def _clamp(shape: Shape, lo: int, hi: int | None) -> list[str]:
    """The spellings of ``shape`` restricted to lengths ``lo..hi`` (none if it has none)."""
    fixed = sum(p.w for p in shape if not p.var)
    var = [i for i, p in enumerate(shape) if p.var and p.w > 0]
    width = (fixed + sum(shape[i].w * shape[i].lo for i in var),
             None if any(shape[i].hi is None for i in var)
             else fixed + sum(shape[i].w * shape[i].hi for i in var))
    if _within(width, lo, hi):
        return ["".join(p.spelled(p.lo, p.hi) for p in shape)]
    if not var:
        return []
    free = max(var, key=lambda i: math.inf if shape[i].hi is None else shape[i].hi - shape[i].lo)
    pinned = [i for i in var if i != free]
    if any(shape[i].hi is None for i in pinned):
        raise Unfoldable("several unbounded repeats share the length")
    ranges = [range(shape[i].lo, shape[i].hi + 1) for i in pinned]
    if math.prod(len(r) for r in ranges) > MAX_SHAPES:
        raise Unfoldable(f"it spells out to over {MAX_SHAPES} alternatives")
    out = []
    for counts in itertools.product(*ranges):
        fixed_now = dict(zip(pinned, counts))
        used = fixed + sum(shape[i].w * k for i, k in fixed_now.items())
        span = _count_range(shape[free], used, lo, hi)
        if span is None:
            continue
        out.append("".join(p.spelled(*span) if i == free else
                           p.spelled(fixed_now[i], fixed_now[i]) if i in fixed_now else
                           p.spelled(p.lo, p.hi) for i, p in enumerate(shape)))
    return out


def _count_range(p: Piece, used: int, lo: int, hi: int | None) -> tuple[int, int | None] | None:
    """Counts ``k`` of repeat ``p`` with ``lo <= used + p.w*k <= hi`` (None: no such count)."""
    k_lo = max(p.lo, -(-(lo - used) // p.w))
    k_hi = p.hi if hi is None else ((hi - used) // p.w if p.hi is None
                                   else min(p.hi, (hi - used) // p.w))
    if k_hi is not None and k_lo > k_hi:
        return None
    return k_lo, k_hi


def largest_count(pattern: str) -> int:
    """The largest bounded repeat count in ``pattern`` (0: none; unparsable: 0, the
    folded patterns and the ones that reach here parse)."""
    try:
        tree = _sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return 0
    return _counts(tree)


def _counts(x: Any) -> int:
    if isinstance(x, tuple) and len(x) == 2 and x[0] in _REPEATS:
        lo, hi, sub = x[1]
        return max(hi if hi != _sre_parse.MAXREPEAT else lo, _counts(sub))
    if isinstance(x, (_sre_parse.SubPattern, list, tuple)):
        return max((_counts(y) for y in x), default=0)
    return 0

"""The finite set of values a unique array's items may take, and whether an item written in part
can still become one the array does not have yet.

``schema/arrays.py`` expands a unique array over a small domain into an enum of arrays; a larger
finite domain stays a marked array whose ``items`` are an ``enum`` (or an integer range), and the
grammar then only spells those values. Without more, such an array reaches dead ends that no
token avoids: every value used and a ``,`` written (``["a", "b", `` over ``^[ab]$``), or a
string begun that only a used value finishes (``"y`` of ``x|yy|z`` once ``yy`` is in). The
guard (``unique_items.ItemTokens``) masks a token after which ``Domain.fits`` fails: the open
item, as written so far, must be the start of a value of the domain the array does not have.

An item's text is compared as the backends spell the values: a string by its decoded
characters, an integer by its digits, anything else by its compact JSON (whitespace outside
strings left out) against the spellings ``json.dumps``, ``repr`` and C's ``%.17g`` give.
"""
from __future__ import annotations

import json
from bisect import bisect_left
from decimal import Decimal
from typing import Any

from ..schema.arrays import UNIQUE_MARK, canonical

_SPACE = b" \t\r\n"
_CACHE_SIZE = 1024
_cache: dict[int, tuple[Any, "Domain | None"]] = {}  # id(node) -> (node, its domain)


class Domain:
    """The values of an ``enum`` of items (canonical, as ``unique_items.item_value`` reads an
    item)."""

    def __init__(self, values: list) -> None:
        self.keys = frozenset(canonical(v) for v in values)
        self.strings = sorted({v for v in values if isinstance(v, str)})
        self.value = {s: canonical(v) for v in values if not isinstance(v, str)
                      for s in _spellings(v)}
        self.spelled = sorted(self.value)

    def fits(self, text: bytes, names: frozenset) -> bool:
        """True if the item ``text`` (written so far) can still become a value not in
        ``names``."""
        text = text.lstrip(_SPACE)
        if not text:
            return not self.keys <= names
        if text[:1] == b'"':
            prefix = _string_prefix(text[1:])
            return prefix is None or _any_new(self.strings, prefix, names, str)
        return _any_new(self.spelled, _compact(text), names, self.value.__getitem__)


class IntRange:
    """The integers ``lo..hi`` (an integer schema with both bounds and nothing else), spelled
    as JSON integers; counted, never listed."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def fits(self, text: bytes, names: frozenset) -> bool:
        written = text.lstrip(_SPACE).decode("ascii", "replace")
        negative = written.startswith("-")
        digits = written[1:] if negative else written
        if digits and not digits.isdigit():
            return True  # no integer spelling: the grammar rules it out, not this
        used = sum(1 for n in names if self._spelled_with(n, negative, digits))
        return self._count(negative, digits) > used

    def _spelled_with(self, name: Any, negative: bool, digits: str) -> bool:
        if not (isinstance(name, tuple) and name[0] == "n"):
            return False
        value = name[1]
        if value != value.to_integral_value() or not self.lo <= value <= self.hi:
            return False
        v = int(value)
        return (v < 0) == negative and str(abs(v)).startswith(digits)

    def _count(self, negative: bool, digits: str) -> int:
        """How many integers of the range are spelled starting with ``-``/nothing and then
        ``digits``."""
        if negative:
            return _count_prefixed(max(1, -self.hi), -self.lo, digits)
        return _count_prefixed(max(0, self.lo), self.hi, digits)


def domain_of(cands: tuple) -> Domain | IntRange | None:
    """The domain of the items of an array whose schema candidates are ``cands`` (one marked
    unique): None unless every candidate that may be an array has one (the union, when all are
    enums)."""
    parts = [_items_domain(c) for c in cands if _may_be_array(c)]
    if not parts or None in parts:
        return None
    if len(parts) == 1:
        return parts[0]
    if not all(isinstance(p, Domain) for p in parts):
        return None
    return Domain([v for c in cands if _may_be_array(c) for v in c["items"]["enum"]])


def _items_domain(node: dict) -> Domain | IntRange | None:
    hit = _cache.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    items = node.get("items")
    domain: Domain | IntRange | None = None
    if "prefixItems" in node or not isinstance(items, dict):
        domain = None
    elif set(items) == {"enum"} and isinstance(items["enum"], list):
        domain = Domain(items["enum"])
    elif items.get("type") == "integer" and set(items) == {"type", "minimum", "maximum"}:
        domain = IntRange(items["minimum"], items["maximum"])
    if len(_cache) > _CACHE_SIZE:
        _cache.clear()
    _cache[id(node)] = (node, domain)  # NOTE: the node is kept, so its id is not reused
    return domain


def _may_be_array(node: dict) -> bool:
    """A candidate whose instance may be an array (a combinator or reference wrapper is not:
    its branches and target are candidates too)."""
    if node.get(UNIQUE_MARK):
        return True
    kind = node.get("type")
    if kind is None:
        return not any(k in node for k in ("anyOf", "oneOf", "allOf", "$ref", "enum", "const"))
    return kind == "array" or isinstance(kind, list) and "array" in kind


def _any_new(texts: list, prefix: Any, names: frozenset, value: Any) -> bool:
    """True if one of the sorted ``texts`` starting with ``prefix`` spells a ``value`` not in
    ``names``."""
    i = bisect_left(texts, prefix)
    while i < len(texts) and texts[i].startswith(prefix):
        if value(texts[i]) not in names:
            return True
        i += 1
    return False


def _count_prefixed(a: int, b: int, digits: str) -> int:
    """How many integers in ``a..b`` (``a >= 0``) are written starting with ``digits``."""
    if a > b:
        return 0
    if not digits:
        return b - a + 1
    if digits[0] == "0":
        return 1 if digits == "0" and a == 0 else 0
    n, scale, total = int(digits), 1, 0
    while n * scale <= b:
        total += max(0, min(b, (n + 1) * scale - 1) - max(a, n * scale) + 1)
        scale *= 10
    return total


def _string_prefix(content: bytes) -> str | None:
    """The characters of an open string's ``content`` (a split escape or UTF-8 sequence at its
    end left out); None if it does not decode."""
    for cut in range(min(len(content), 6) + 1):
        try:
            return json.loads(b'"' + content[:len(content) - cut] + b'"')
        except ValueError:
            continue
    return None


def _compact(text: bytes) -> bytes:
    """``text`` without the whitespace outside its strings."""
    if not any(c in text for c in _SPACE):
        return text
    out, in_string, escaped = bytearray(), False, False
    for c in text:
        if escaped:
            escaped = False
        elif in_string:
            escaped, in_string = c == 0x5C, c != 0x22
        elif c in _SPACE:
            continue
        else:
            in_string = c == 0x22
        out.append(c)
    return bytes(out)


def _spellings(value: Any) -> set[bytes]:
    """How a backend may write ``value`` (not a string) in compact JSON."""
    out = {json.dumps(value, separators=(",", ":"), ensure_ascii=a).encode() for a in (0, 1)}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        out |= {repr(float(value)).encode(), (b"%.17g" % float(value))}
        if number == number.to_integral_value():
            out |= {str(int(number)).encode(), f"{int(number)}.0".encode()}
    return out

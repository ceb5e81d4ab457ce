"""Regexes for JSON numbers within bounds: ``minimum``/``maximum`` (and the exclusive forms) for
a backend whose JSON-schema compiler ignores them (outlines-core).

A bounded integer is spelled exactly: every decimal integer in the range, no leading zeros, no
``-0`` (a range is split by sign, then by number of digits, then digit by digit, as in the
classic range-to-regex construction: O(digits) alternatives). A bounded number is an integer
part and an optional fraction, without an exponent: a subset of the JSON spellings of the range
(``1e2`` is left out), so every output is in range. Number bounds must be integers (``ge=0``,
``le=100``: what schemas write); a fractional bound raises ``ValueError`` and the caller rejects
the schema, naming the keyword.
"""
from __future__ import annotations

import math

_ANY_FRACTION = r"(\.[0-9]+)?"
_NONZERO_FRACTION = r"\.[0-9]*[1-9][0-9]*"


def bounds_of(node: dict) -> tuple[float | None, bool, float | None, bool]:
    """(low, low exclusive, high, high exclusive) of a schema node (draft 6+ forms: the
    normalizer has already rewritten draft-04's boolean exclusives); the tighter bound wins."""
    lo, lo_x = _tighter(node.get("minimum"), node.get("exclusiveMinimum"), lower=True)
    hi, hi_x = _tighter(node.get("maximum"), node.get("exclusiveMaximum"), lower=False)
    return lo, lo_x, hi, hi_x


def _tighter(inclusive: float | None, exclusive: float | None,
             lower: bool) -> tuple[float | None, bool]:
    if exclusive is None or isinstance(exclusive, bool):
        return inclusive, False
    if inclusive is None or exclusive == inclusive:
        return exclusive, True
    if (exclusive > inclusive) == lower:
        return exclusive, True
    return inclusive, False


def integer_regex(lo: float | None, lo_x: bool, hi: float | None, hi_x: bool) -> str | None:
    """Every integer in the range, or None if there is none."""
    low = None if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
    high = None if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
    if low is not None and high is not None and low > high:
        return None
    alts = []
    if high is None or high >= 0:  # the non-negative part: [max(low, 0), high]
        alts += _naturals(max(low, 0) if low is not None else 0, high)
    if low is None or low < 0:  # the negative part, by magnitude: [max(-high, 1), -low]
        neg = _naturals(max(-high, 1) if high is not None else 1,
                        None if low is None else -low)
        if neg:
            alts.append("-" + _group(neg))
    return _group(alts) if alts else None


def number_regex(lo: float | None, lo_x: bool, hi: float | None, hi_x: bool) -> str | None:
    """Decimal spellings (no exponent) of numbers in the range, or None if there is none.
    Raises ``ValueError`` for a bound that is not an integer."""
    for bound in (lo, hi):
        if bound is not None and bound != math.floor(bound):
            raise ValueError(f"the bound {bound} is not an integer")
    lo = None if lo is None else int(lo)
    hi = None if hi is None else int(hi)
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x))):
        return None
    alts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_x):
        low, low_x = (0, False) if lo is None or lo < 0 else (lo, lo_x)
        alts += _decimals(low, low_x, hi, hi_x)
    if lo is None or lo < 0:  # magnitudes in (max(-hi, 0), -lo]: never -0
        low, low_x = (-hi, hi_x) if hi is not None and hi < 0 else (0, True)
        neg = _decimals(low, low_x, None if lo is None else -lo, lo_x)
        if neg:
            alts.append("-" + _group(neg))
    return _group(alts) if alts else None


def _decimals(a: int, a_x: bool, b: int | None, b_x: bool) -> list[str]:
    """Non-negative decimals in the range [a, b] (exclusive ends per flag; b None: no end)."""
    out = []
    whole_from = a + 1 if a_x else a  # integer parts whose every fraction is in range
    if a_x and (b is None or a < b):
        out.append(f"{a}{_NONZERO_FRACTION}")
    whole_to = None if b is None else b - 1
    if whole_to is None or whole_from <= whole_to:
        out += [f"{_group(_naturals(whole_from, whole_to))}{_ANY_FRACTION}"]
    if b is not None and not b_x and b >= whole_from:
        out.append(rf"{b}(\.0+)?")
    return out


def _naturals(a: int, b: int | None) -> list[str]:
    """Alternatives spelling every integer in [a, b] (a >= 0; b None: unbounded)."""
    if b is not None and a > b:
        return []
    la = len(str(a))
    last = la if b is None else len(str(b))
    out = []
    for length in range(la, last + 1):
        low = a if length == la else 10 ** (length - 1)
        high = b if b is not None and length == last else 10 ** length - 1
        out += _same_length(str(low), str(high))
    if b is None:
        out.append(f"[1-9][0-9]{{{la},}}")
    return out


def _same_length(lo: str, hi: str) -> list[str]:
    if lo == hi:
        return [lo]
    if len(lo) == 1:
        return [_cls(lo, hi)]
    if lo[0] == hi[0]:
        return [lo[0] + _group(_same_length(lo[1:], hi[1:]))]
    rest = len(lo) - 1
    lo_full, hi_full = lo[1:] == "0" * rest, hi[1:] == "9" * rest
    first = lo[0] if lo_full else chr(ord(lo[0]) + 1)
    last = hi[0] if hi_full else chr(ord(hi[0]) - 1)
    out = [] if lo_full else [lo[0] + _group(_same_length(lo[1:], "9" * rest))]
    if first <= last:
        out.append(f"{_cls(first, last)}[0-9]{{{rest}}}")
    if not hi_full:
        out.append(hi[0] + _group(_same_length("0" * rest, hi[1:])))
    return out


def _cls(a: str, b: str) -> str:
    return a if a == b else f"[{a}-{b}]"


def _group(alts: list[str]) -> str:
    return alts[0] if len(alts) == 1 else "(" + "|".join(alts) + ")"

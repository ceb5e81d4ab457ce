"""Numeric bounds as regexes (``number_range.py``) and their use by the outlines backend, whose
schema compiler ignores ``minimum``/``maximum`` (``outlines_bounds.py``)."""
from __future__ import annotations

import itertools
import random
import re
from fractions import Fraction

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.backends.number_range import bounds_of, integer_regex, number_regex

BOUNDS = [None, -1000, -101, -100, -10, -9, -1, 0, 1, 9, 10, 11, 99, 100, 150, 999, 65535]
INTS = list(range(-1100, 1100, 3)) + [-1, 0, 1, 65535, 65536, 99999, 123456, -123456]
DECIMALS = [f"{i}.{f}" for i in range(-120, 120) for f in ("0", "5", "05", "00", "99")]


def _inside(v, lo, lo_x, hi, hi_x) -> bool:
    return (lo is None or (v > lo if lo_x else v >= lo)) and \
        (hi is None or (v < hi if hi_x else v <= hi))


def _ranges():
    for lo, hi, lo_x, hi_x in itertools.product(BOUNDS, BOUNDS, (False, True), (False, True)):
        if not (lo is None and lo_x or hi is None and hi_x):
            yield lo, lo_x, hi, hi_x


def test_integer_ranges_are_exact():
    for lo, lo_x, hi, hi_x in _ranges():
        rx = integer_regex(lo, lo_x, hi, hi_x)
        for v in INTS:
            matched = rx is not None and re.fullmatch(rx, str(v)) is not None
            assert matched == _inside(v, lo, lo_x, hi, hi_x), (lo, lo_x, hi, hi_x, v, rx)
        for spelling in ("-0", "007", "-01", "1.0", "1e2", ""):  # not how JSON writes integers
            assert rx is None or not re.fullmatch(rx, spelling), (rx, spelling)


def test_number_ranges_are_sound_and_keep_every_plain_decimal():
    for lo, lo_x, hi, hi_x in _ranges():
        rx = number_regex(lo, lo_x, hi, hi_x)
        for s in [str(v) for v in INTS[::5]] + DECIMALS + ["-0", "-0.0"]:
            v = Fraction(s)
            matched = rx is not None and re.fullmatch(rx, s) is not None
            assert not matched or _inside(v, lo, lo_x, hi, hi_x), (lo, lo_x, hi, hi_x, s, rx)
            wanted = _inside(v, lo, lo_x, hi, hi_x) and not (s.startswith("-") and v == 0)
            assert matched or not wanted, (lo, lo_x, hi, hi_x, s, rx)


def test_fractional_bounds():
    assert re.fullmatch(integer_regex(0.5, False, 2.5, True), "1")  # integers: rounded inward
    assert not re.fullmatch(integer_regex(0.5, False, 2.5, True), "0")
    assert integer_regex(0.2, False, 0.8, False) is None
    with pytest.raises(ValueError, match="not an integer"):
        number_regex(0.5, False, None, False)
    # the tighter of an inclusive and an exclusive bound wins; on a tie, the exclusive one
    assert bounds_of({"minimum": 1, "exclusiveMinimum": 3}) == (3, True, None, False)
    assert bounds_of({"maximum": 5, "exclusiveMaximum": 5}) == (None, False, 5, True)
    assert bounds_of({"maximum": 4, "exclusiveMaximum": 9}) == (None, False, 4, False)


SCHEMA = {"type": "object", "properties": {
    "age": {"type": "integer", "minimum": 18, "maximum": 120},
    "score": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "delta": {"type": ["integer", "null"], "minimum": -5, "maximum": 5},
    "levels": {"type": "array", "items": {"type": "integer", "exclusiveMinimum": 0,
                                          "maximum": 3}, "maxItems": 3}},
    "required": ["age", "score", "delta", "levels"], "additionalProperties": False}


def test_outlines_enforces_numeric_bounds(compilers, walker):
    key = GrammarKey.from_constraint("json_schema", SCHEMA)
    assert walker.valid_walks(lambda: compilers["outlines"].compile(key), SCHEMA,
                              random.Random(5), 12, max_steps=120) >= 6


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "number", "minimum": 0.5}, "minimum"),  # a fractional number bound
    ({"type": ["number", "string"], "exclusiveMaximum": 2.5}, "exclusiveMaximum"),
])
def test_outlines_rejects_what_it_cannot_spell(backends, schema, keyword):
    with pytest.raises(InvalidRequestError) as e:
        backends["outlines"].compile(GrammarKey.from_constraint("json_schema", schema))
    assert e.value.field == "json_schema" and f"'{keyword}' at #" in str(e.value)

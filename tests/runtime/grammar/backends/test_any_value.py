"""Untyped values and length-bounded strings for outlines: rewritten to forms outlines-core
indexes in seconds (they took minutes to hours), still admitting only valid instances."""
from __future__ import annotations

import random
import re

import jsonschema
import pytest

from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.backends.any_value import ANY_VALUE, bound_untyped_values, is_untyped

UNTYPED_ARRAY = {"type": "array", "maxItems": 4}
# NOTE: a bound the grammar keeps (larger ones are counted by the runtime: schema/lengths.py)
BOUNDED = {"type": "object", "properties": {"s": {"type": "string", "minLength": 1,
                                                  "maxLength": 16}}, "required": ["s"]}


def test_untyped_positions_are_bounded_and_typed_ones_kept():
    assert is_untyped({}) and is_untyped(True) and is_untyped({"title": "x"})
    assert not is_untyped({"type": "string"}) and not is_untyped(False)
    out = bound_untyped_values({"type": "object", "properties": {
        "a": {}, "b": {"type": "integer"}, "c": {"type": "array"},
        "d": {"type": "object", "additionalProperties": False}}})
    props = out["properties"]
    assert props["a"]["anyOf"] == ANY_VALUE["anyOf"] and props["b"] == {"type": "integer"}
    assert props["c"]["items"] == ANY_VALUE
    assert props["d"] == {"type": "object", "additionalProperties": False}
    free = bound_untyped_values({"type": "object", "maxProperties": 2})
    assert free["additionalProperties"] == ANY_VALUE and free["maxProperties"] == 2


def test_any_value_admits_only_json_values():
    jsonschema.Draft202012Validator.check_schema(ANY_VALUE)
    for value in (1, "x", None, [1, "a"], {"k": 2.5}):
        jsonschema.validate(value, ANY_VALUE)
    with pytest.raises(jsonschema.ValidationError):  # deeper than the bound
        jsonschema.validate([[1]], ANY_VALUE)


@pytest.mark.parametrize("schema", [UNTYPED_ARRAY, BOUNDED], ids=["untyped", "bounded"])
def test_outlines_compiles_and_walks_valid(compilers, tokenizer, walker, schema):
    compiler = compilers["outlines"]
    key = GrammarKey.from_constraint("json_schema", schema)
    finished = walker.valid_walks(lambda: compiler.compile(key), schema, random.Random(11), 3,
                                  max_steps=80)
    compiler.shutdown()
    assert finished >= 2


def test_bounded_strings_keep_every_escape_but_the_quote(backends):
    regex = backends["outlines"].to_regex(GrammarKey.from_constraint("json_schema", BOUNDED))
    assert re.fullmatch(regex, r'{"s":"a\\b\/c\n"}')
    assert re.fullmatch(regex, '{"s":"' + "x" * 16 + '"}')
    assert not re.fullmatch(regex, '{"s":"' + "x" * 17 + '"}')
    assert not re.fullmatch(regex, r'{"s":"a\"b"}')  # the one escape given up (a subset)
    free = backends["outlines"].to_regex(GrammarKey.from_constraint("json_schema",
                                                                    {"type": "string"}))
    assert re.fullmatch(free, r'"a\"b"')  # unbounded strings keep it (they index fast)

"""``patternProperties`` merged (allOf, or siblings distributed into anyOf branches) with a side
that lists properties: each listed name gets every schema both sides give a key of that name;
checked with jsonschema both ways (the rewrite is exact)."""
from __future__ import annotations

import json
import re

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.validator import validator_class

CASES = [
    ("listed names meet the patterns", {"allOf": [
        {"type": "object", "patternProperties": {"^x_": {"type": "integer"}},
         "additionalProperties": False},
        {"properties": {"x_a": {"minimum": 3}, "y": {"type": "string"}}, "required": ["x_a"]}]},
     [{"x_a": 3}, {"x_a": 2}, {"x_a": "s"}, {"x_a": 3.5}, {"x_a": 3, "x_b": 1}, {"x_a": 3, "x_b": "s"},
      {"x_a": 3, "y": "s"}, {"x_a": 3, "z": 1}]),
    ("a dictionary with a fixed key (hayson gridMeta)", {
        "$defs": {"dict": {"type": "object", "properties": {"_kind": {"enum": ["dict"]}},
                           "patternProperties": {"^[a-z][0-9a-zA-Z_]*": {"type": "string"}},
                           "additionalProperties": False}},
        "allOf": [{"$ref": "#/$defs/dict"}], "type": "object", "required": ["ver"],
        "properties": {"ver": {"enum": ["3.0", 3]}}},
     [{"ver": "3.0"}, {"ver": 3}, {"ver": "3.0", "abc": "x"}, {"ver": "3.0", "abc": 1},
      {"ver": "3.0", "_kind": "dict"}, {"ver": "3.0", "_kind": 1}, {"ver": "3.0", "Z": 1}, {}]),
    ("the other side closed", {"allOf": [
        {"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
        {"properties": {"ab": {}, "c": {}}, "additionalProperties": False}]},
     [{"ab": 1}, {"ab": "s"}, {"c": "s"}, {"ad": 1}, {}]),
    ("beside oneOf", {
        "type": "object", "patternProperties": {"^n_": {"type": "integer"}},
        "oneOf": [{"properties": {"n_1": {"maximum": 0}}, "required": ["n_1"]},
                  {"properties": {"k": {"const": 1}}, "required": ["k"]}]},
     [{"n_1": -1}, {"n_1": -0.5}, {"n_1": 1}, {"n_1": "s"}, {"k": 1}, {"k": 2}, {"k": 1, "n_2": "s"},
      {"k": 1, "n_2": 5}]),
]


def _valid(schema, value) -> bool:
    return validator_class(schema)(schema).is_valid(value)


def _as_backends_read(node):
    """``node`` with its patternProperties kept off listed names: the backends give a listed
    key its property schema alone, so that schema must hold the patterns' constraints."""
    if isinstance(node, dict) and "anyOf" in node:
        return {"anyOf": [_as_backends_read(b) for b in node["anyOf"]]}
    if not (isinstance(node, dict) and node.get("properties") and node.get("patternProperties")):
        return node
    names = "|".join(re.escape(n) for n in node["properties"])
    pats = {f"^(?!(?:{names})$)[\\s\\S]*?(?:{p})": s
            for p, s in node["patternProperties"].items()}
    return {**node, "patternProperties": pats}


@pytest.mark.parametrize("name,schema,instances", CASES, ids=[c[0] for c in CASES])
def test_pattern_properties_merge_is_exact(name, schema, instances):
    norm = normalize_schema(schema, "xgrammar")
    assert "allOf" not in json.dumps(norm)
    accepted = 0
    for value in instances:
        assert _valid(norm, value) == _valid(schema, value), (value, norm)
        assert _valid(_as_backends_read(norm), value) == _valid(schema, value), (value, norm)
        accepted += _valid(norm, value)
    assert 0 < accepted < len(instances)


@pytest.mark.parametrize("schema", [
    {"allOf": [{"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
               {"patternProperties": {"b$": {"type": "string"}}}]},
    {"allOf": [{"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
               {"additionalProperties": {"type": "string"}}]},
])
def test_merges_needing_pattern_intersections_are_rejected(schema):
    with pytest.raises(InvalidRequestError, match="'patternProperties' at #"):
        normalize_schema(schema)


def test_required_names_only_patterns_match_are_listed_with_the_patterns_schemas():
    # xgrammar emits listed properties only: a required name left unlisted was skipped
    # (Github_medium__o83286's attributes lacked every required key)
    schema = {"type": "object", "required": ["ab", "b1", "zz"],
              "patternProperties": {"^a": {"type": "integer"}, "b": {"minimum": 0},
                                    "^[a-z]+$": {"maximum": 9}}}
    norm = normalize_schema(schema)
    props = norm["properties"]
    assert set(props) == {"ab", "b1", "zz"}
    for name, value, ok in (("ab", 3, True), ("ab", 10, False), ("ab", 1.5, False),
                            ("b1", -1, False), ("b1", 50, True), ("zz", 10, False),
                            ("zz", 9, True)):
        assert _valid(_as_backends_read(norm), {"ab": 1, "b1": 1, "zz": 1, name: value}) == ok
        assert _valid(schema, {"ab": 1, "b1": 1, "zz": 1, name: value}) == ok
    closed = {**schema, "additionalProperties": False, "required": ["ab", "Q"]}
    with pytest.raises(InvalidRequestError, match="no instance"):
        normalize_schema(closed)

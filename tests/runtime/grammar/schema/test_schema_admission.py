"""Rewrites that admit real-world schemas the normalizer used to reject (issue 15 item 2), each
checked two ways: the normal form against the original with jsonschema over hand-picked
instances (exact rewrites both ways), and xgrammar-constrained random walks whose finished
outputs must validate against the ORIGINAL schema."""
from __future__ import annotations

import json
import random

import pytest

from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.subsume import drop_subsumed, implies
from sgdsl.runtime.grammar.schema.validator import validator_class

# JFrog filespec, cut down: each dependency forbids one of a list of keys, which multiplied out
# to over 64 alternatives before the ones inside another were dropped.
_KEYS = ["pattern", "aql", "build", "bundle", "limit", "offset", "props", "flat"]
DEPENDENT_NOTS = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object", "additionalProperties": False,
    "properties": {k: {"type": "string"} for k in _KEYS},
    "anyOf": [{"required": ["pattern"]}, {"required": ["aql"]}, {"required": ["build"]}],
    "dependencies": {
        "pattern": {"not": {"required": ["aql"]}},
        "aql": {"not": {"required": ["pattern", "props", "flat", "limit"]}},
        "build": {"not": {"required": ["bundle", "limit", "offset"]}},
        "bundle": {"not": {"required": ["build", "limit", "offset"]}},
        "limit": {"required": ["build"]}}}
MIN_PROPERTIES = {"type": "object", "required": ["options"], "additionalProperties": False,
                  "properties": {"options": {"type": "object", "minProperties": 2,
                                             "properties": {"a": {"type": "integer"}}}}}
# A tree whose children must carry a value the root may leave out: the recursive $ref meets
# other keywords inside its own definition (sourcemap-v3's sections, ajv's secure meta-schema).
TREE = {"$defs": {"node": {
    "type": "object", "additionalProperties": False,
    "properties": {"v": {"type": "integer"},
                   "kids": {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/node"},
                                                                 {"required": ["v"]}]}}}}},
    "$ref": "#/$defs/node"}
# hayson's gridMeta, recursive: a dictionary of values (strings or dictionaries) with a fixed
# "ver" key the pattern also matches, merged while the dictionary is still being built.
HVAL = {"$defs": {
    "hval": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/dict"},
                       {"$ref": "#/$defs/meta"}]},
    "dict": {"type": "object", "additionalProperties": False,
             "patternProperties": {"^[a-z]": {"$ref": "#/$defs/hval"}}},
    "meta": {"allOf": [{"$ref": "#/$defs/dict"}], "type": "object", "required": ["ver"],
             "properties": {"ver": {"enum": ["3.0", 3]}}}},
    "$ref": "#/$defs/hval"}
# vs-nesting: unique items given by a pattern alone (kept distinct by the runtime)
UNTYPED_UNIQUE = {"type": "object", "required": ["ext"], "additionalProperties": False,
                  "properties": {"ext": {"type": "array", "uniqueItems": True, "minItems": 2,
                                         "maxItems": 3, "items": {"pattern": "^[ab]+$"}}}}
# (name, schema, instances, exact)
CASES = [
    ("recursive $ref met inside its own definition", TREE,
     [{}, {"kids": []}, {"kids": [{"v": 1}]}, {"kids": [{}]}, {"v": 1, "kids": [{"v": 2,
      "kids": [{"v": 3}]}]}, {"kids": [{"v": 2, "kids": [{}]}]}, {"kids": [{"v": "s"}]}], True),
    ("recursive dictionary with a fixed key", HVAL,
     ["s", {"ab": "s"}, {"ver": "3.0"}, {"ver": 3}, {"ab": {"ver": "3.0", "x": "y"}},
      {"ab": {"ver": 3}}, {"Ab": "s"}, 1], True),
    ("dependencies forbidding one of a list", DEPENDENT_NOTS,
     [{"pattern": "p"}, {"pattern": "p", "aql": "q"}, {"aql": "q", "props": "x"},
      {"aql": "q", "pattern": "p", "props": "x", "flat": "f", "limit": "1"},
      {"build": "b", "bundle": "c", "limit": "1"}, {"build": "b", "limit": "1"},
      {"limit": "1", "pattern": "p"}, {"bundle": "c"}, {}], True),
    ("a branch inside another", {"anyOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}},
         "required": ["a", "b"]},
        {"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]}]},
     [{"a": 3, "b": 1}, {"a": 1.5}, {"a": "s"}, {}, 4], True),
    ("minProperties over the listed keys", MIN_PROPERTIES,
     [{"options": {"a": 1, "b": 2}}, {"options": {"a": 1}}, {"options": {"x": [], "y": {}}},
      {"options": {"a": "s", "b": 2}}, {"options": {}}], True),
]


def _valid(schema, value) -> bool:
    return validator_class(schema)(schema).is_valid(value)


@pytest.mark.parametrize("name,schema,instances,exact", CASES, ids=[c[0] for c in CASES])
def test_normal_form_accepts_only_instances_of_the_original(name, schema, instances, exact):
    norm = normalize_schema(schema, "xgrammar")
    for value in instances:
        if _valid(norm, value):
            assert _valid(schema, value), (value, norm)
        elif exact:
            assert not _valid(schema, value), (value, norm)


def test_subsumed_branches_are_dropped_and_the_product_stays_small():
    norm = normalize_schema(DEPENDENT_NOTS)
    assert len(norm["anyOf"]) <= 16, len(norm["anyOf"])
    wide, narrow = {"type": "number"}, {"type": "integer", "minimum": 0}
    assert drop_subsumed([narrow, wide]) == [wide]
    assert drop_subsumed([wide, dict(wide)]) == [wide]  # equal: the first stays
    assert not implies(wide, narrow)
    # a closed object does not imply an open one with the same listed keys, nor the reverse
    closed = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    assert implies(closed, {"type": "object", "properties": {"a": {}}})
    assert not implies({"type": "object", "properties": {"a": {}}}, closed)
    assert not implies({"type": "object", "properties": {"a": {}, "b": {}},
                        "additionalProperties": False}, closed)
    assert implies({"enum": [1, 2]}, {"type": "integer", "maximum": 2})


def test_open_object_for_min_properties_and_impossible_closed_one():
    norm = normalize_schema(MIN_PROPERTIES)
    assert norm["properties"]["options"]["additionalProperties"] == {}
    closed = {"type": "object", "minProperties": 2, "additionalProperties": False,
              "properties": {"a": {}, "b": False}}
    with pytest.raises(Exception, match="no instance"):
        normalize_schema(closed)
    # object keywords on a string say nothing
    text = {"type": "string", "minProperties": 2, "additionalProperties": False}
    assert normalize_schema(text) == text


def walk_outputs(compilers, walker, quotes, schema, walks: int = 12) -> list:
    """Finished outputs of xgrammar-constrained random walks, guarded as the runtime guards
    them (duplicate keys under open objects are the guard's, ``unique_keys.py``)."""
    from sgdsl.runtime.grammar import GrammarKey
    from sgdsl.runtime.grammar.guards.unique_keys import guard_keys

    key = GrammarKey.from_constraint("json_schema", schema)
    rng = random.Random(7)
    out = []
    for _ in range(walks):
        grammar = guard_keys(compilers["xgrammar"].compile(key), key, quotes, "xgrammar")
        text, done = walker.walk(grammar, rng, max_steps=120)
        if done:
            out.append(json.loads(text))
    return out


def test_unique_items_marked_and_array_keywords_dropped_off_arrays():
    from sgdsl.runtime.grammar.schema.arrays import UNIQUE_MARK

    ext = normalize_schema(UNTYPED_UNIQUE)["properties"]["ext"]
    assert ext[UNIQUE_MARK] is True and ext["items"]["type"] == "string"
    # array keywords on a node that cannot be an array say nothing (paper-plugin's authors)
    authors = {"type": "array", "items": {"type": "string", "uniqueItems": True}}
    assert normalize_schema(authors) == {"type": "array", "items": {"type": "string"}}


def test_recursive_merges_become_shared_definitions():
    norm = normalize_schema(TREE)
    merged = [name for name in norm["$defs"] if "m" in name]
    assert len(merged) == 1, norm
    assert norm["$defs"][merged[0]]["required"] == ["v"]
    impossible = {"$defs": {"n": {"type": "object", "properties": {
        "k": {"allOf": [{"$ref": "#/$defs/n"}, {"type": "string"}]}}}}, "$ref": "#/$defs/n"}
    with pytest.raises(Exception, match="'\\$ref' at .*has no instance"):
        normalize_schema(impossible)  # found only once the definition is complete


@pytest.mark.parametrize("schema", [DEPENDENT_NOTS, MIN_PROPERTIES, TREE, HVAL, UNTYPED_UNIQUE],
                         ids=["dependencies", "minProperties", "tree", "hval", "unique"])
def test_xgrammar_walks_validate_against_the_original(compilers, walker, quotes, schema):
    outputs = walk_outputs(compilers, walker, quotes, schema)
    assert len(outputs) >= 3
    for value in outputs:
        assert _valid(schema, value), value

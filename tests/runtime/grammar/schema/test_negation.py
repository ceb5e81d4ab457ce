"""``not`` rewritten without ``not``: the normal form must accept only instances of the original
(checked with jsonschema), and exactly them where the rewrite is exact; forms whose normal form
is narrower than written (formats, patterns, uniqueItems) must not be negated."""
from __future__ import annotations

import json
import random

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.string_complement import complement_regex
from sgdsl.runtime.grammar.schema.validator import validator_class

ANY = [None, True, False, 0, 1, 1.0, 2, 2.5, 3, -1, "", "a", "ab", "abc", "CAN", "CANX", "CA",
       [], [1], [1, 2], {}, {"a": 1}]
EMPTY = {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 0}]}
OBJS = [{}, {"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {"c": 3}, {"a": 1, "c": 3}]
# (name, schema, instances, exact)
CASES = [
    ("not all required", {"type": "object", "properties": {"a": {}, "b": {}, "c": {}},
                          "not": {"required": ["a", "b"]}}, OBJS, True),
    ("not any of required", {"type": "object", "properties": {"a": {}, "b": {}, "c": {}},
                             "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}},
     OBJS, True),
    ("not enum, any type", {"not": {"enum": ["CAN", "MEX", "USA"]}}, ANY + ["MEX", "USA "], True),
    ("not enum of every kind", {"not": {"enum": [1, 2.5, True, None, "a", "CAN"]}}, ANY, True),
    ("not enum in integers", {"type": "integer", "not": {"enum": [1, 3]}},
     [0, 1, 2, 3, 4, -5, 1.0], True),
    ("not enum in strings", {"type": "string", "not": {"enum": ["boolean", "bool", "b", ""]}},
     ["boolean", "bool", "b", "", "boo", "booleans", "x", "Bool", "bo"], True),
    ("not const", {"type": "object", "properties": {"t": {"type": "string"}},
                   "not": {"properties": {"t": {"const": "car"}}}},
     [{"t": "car"}, {"t": "cat"}, {}, {"t": "cars"}], True),
    ("not types", {"not": {"type": ["array", "object", "null"]}}, ANY, True),
    ("not bounds without type", {"not": {"minLength": 2, "maximum": 2}}, ANY, True),
    ("not typed bounds", {"not": {"type": "number", "minimum": 1, "exclusiveMaximum": 3}},
     ANY, True),
    ("not count bounds", {"not": {"type": "array", "maxItems": 1}}, ANY, True),
    ("not one-class pattern", {"type": "string", "maxLength": 5,
                               "not": {"pattern": "[^a-c .-]"}},
     # (not "ab\n": Python's "$" matches before a final newline, ECMA-262's and xgrammar's not)
     ["abc", "a-b c", "abcd", "a.b.c.", "", "xyz", "a\nb"], True),
    ("not not", {"not": {"not": {"type": "string"}}}, ANY, True),
    ("nested properties with a $ref", {
        "$defs": {"empty": EMPTY}, "type": "object",
        "properties": {"org": {"type": ["string", "null"]},
                       "x": {"type": "object", "properties": {"kind": {"type": "string"}}}},
        "not": {"properties": {"x": {"properties": {"kind": {"enum": ["organization"]}}},
                               "org": {"$ref": "#/$defs/empty"}}}},
     [{"x": {"kind": "organization"}, "org": ""}, {"x": {"kind": "organization"}, "org": "A"},
      {"x": {"kind": "person"}, "org": ""}, {"x": {"kind": "organization"}}, {"org": None}, {}],
     True),
    ("if on a value without enum", {
        "type": "object", "properties": {"k": {"type": "string"}, "b": {}, "c": {}},
        "if": {"properties": {"k": {"const": "x"}}}, "then": {"required": ["b"]},
        "else": {"required": ["c"]}},
     [{"k": "x", "b": 1}, {"k": "x", "c": 1}, {"k": "y", "c": 1}, {"k": "y", "b": 1},
      {"c": 1}, {"b": 1}], True),
    ("not items not (contains)", {"not": {"items": {"not": {"const": 1}}}},
     [[1], [1, 2], [2, 1], [2], [], 5], False),
    ("if with a format stays sound", {
        "type": "object", "properties": {"e": {"type": "string"}, "b": {}, "c": {}},
        "if": {"properties": {"e": {"format": "email"}}}, "then": {"required": ["b"]},
        "else": {"required": ["c"]}},
     [{"e": "a@b.co", "b": 1}, {"e": "a@b.co", "c": 1}, {"e": "x", "c": 1}, {"e": "x", "b": 1}],
     False),
]


def _valid(schema, value) -> bool:
    return validator_class(schema)(schema).is_valid(value)


@pytest.mark.parametrize("name,schema,instances,exact", CASES, ids=[c[0] for c in CASES])
def test_negation_accepts_only_instances_of_the_original(name, schema, instances, exact):
    norm = normalize_schema(schema, "xgrammar")
    assert '"not"' not in json.dumps(norm), norm
    accepted = 0
    for value in instances:
        if _valid(norm, value):
            accepted += 1
            assert _valid(schema, value), (value, norm)
        elif exact:
            assert not _valid(schema, value), (value, norm)
    assert 0 < accepted < len(instances)


@pytest.mark.parametrize("schema", [
    {"not": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True}},
    {"not": {"type": "string", "format": "email"}},
    {"not": {"pattern": "^a+$"}},  # anchored: its complement is no one class
    {"not": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}},
    {"not": {"type": "integer"}},  # "a number that is not an integer"
    {"not": {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}},
    {"not": {"enum": [{"a": 1}]}},  # every object but one
])
def test_negations_of_narrowed_or_unspellable_forms_are_rejected(schema):
    with pytest.raises(InvalidRequestError, match="'not' at #"):
        normalize_schema(schema)


def test_complement_regex_is_exact():
    import re

    rng = random.Random(3)
    for banned in (["CAN", "MEX", "USA"], [""], ["a", "ab", "abc"], ["x-y", "é", "a b"]):
        regex = complement_regex(banned)
        pool = banned + [b[:i] for b in banned for i in range(len(b))] + \
            [b + c for b in banned for c in "ab-é\n"] + \
            ["".join(rng.choice("abcxyCANMEUS-é \n") for _ in range(rng.randint(0, 5)))
             for _ in range(300)]
        for s in pool:
            assert bool(re.fullmatch(regex, s)) == (s not in banned), (banned, regex, s)
    assert complement_regex(["\U0001F600"]) is None  # beyond the BMP: dialects differ
    assert complement_regex(["x" * 5000]) is None  # too large


def test_xgrammar_enforces_a_negated_enum():
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    norm = normalize_schema({"type": "string", "not": {"enum": ["CAN", "MEX", "USA"]}})
    grammar = Grammar.from_json_schema(json.dumps(norm), any_whitespace=False)
    for s, ok in (("CAN", False), ("USA", False), ("CA", True), ("CANA", True), ("", True),
                  ("usa", True), ("MEXICO", True)):
        assert _is_grammar_accept_string(grammar, json.dumps(s)) == ok, s

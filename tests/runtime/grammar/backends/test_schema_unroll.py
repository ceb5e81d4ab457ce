"""Recursive ``$ref`` schemas: the bounded unroller (pure) and both backends on the schemas that
made outlines-core emit invalid JSON at its own recursion limit."""
from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.backends.schema_unroll import (has_recursive_ref, unroll_recursive_refs,
                                                 unroll_schema_text)

from ..helpers import feed_text

SCHEMAS = Path(__file__).parents[3] / "data" / "schemas" / "json"
LINKED = json.loads((SCHEMAS / "ref_ref_linked_list.json").read_text())
# What outlines-core's regex for LINKED accepted (and a greedy model produced) before the fix.
BROKEN = '{"v":1,"next":{"v":1,"next":{"v":1,"next":{"v":1,}}}}'


def _spell(text: str, backend: str) -> str:
    """Compact JSON as ``backend`` writes it (xgrammar puts a space after ':' and ',')."""
    return text.replace('":', '": ').replace(",", ", ") if backend == "xgrammar" else text


def test_detects_recursion_only_through_applied_refs():
    assert has_recursive_ref(LINKED)
    assert has_recursive_ref({"type": "array", "items": {"$ref": "#"}})
    shared = {"$defs": {"p": {"type": "integer"}, "unused": {"$ref": "#/$defs/unused"}},
              "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#/$defs/p"}}}
    assert not has_recursive_ref(shared)  # a self-reference nobody applies is harmless
    text = json.dumps(shared)
    assert unroll_schema_text(text) is text  # non-recursive schemas pass through untouched


def test_linked_list_bottom_allows_only_null():
    out = unroll_recursive_refs(LINKED, max_depth=2)
    inner = out["properties"]["next"]["anyOf"][0]
    assert out["properties"]["next"]["anyOf"][1] == {"type": "null"}
    assert inner["properties"]["next"] == {"anyOf": [{"type": "null"}]}
    assert "$ref" not in json.dumps(out) and "$defs" not in out
    jsonschema.validate({"v": 1, "next": {"v": 2, "next": None}}, out)
    with pytest.raises(jsonschema.ValidationError):  # deeper than the bound: not admitted
        jsonschema.validate({"v": 1, "next": {"v": 2, "next": {"v": 3, "next": None}}}, out)


def test_impossible_items_leave_empty_array_and_optional_props_drop():
    tree = {"type": "object", "required": ["v"], "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}},
        "parent": {"$ref": "#"}}}
    out = unroll_recursive_refs(tree, max_depth=1)
    kid = out["properties"]["kids"]["items"]
    assert kid["properties"]["kids"] == {"type": "array", "maxItems": 0}
    assert "parent" not in kid["properties"]  # optional and impossible: left out
    jsonschema.validate({"v": 1, "kids": [{"v": 2, "kids": []}]}, out)


def test_schema_without_finite_instance_is_rejected():
    endless = {"$defs": {"a": {"type": "object", "required": ["x"],
                               "properties": {"x": {"$ref": "#/$defs/a"}}}},
               "$ref": "#/$defs/a"}
    with pytest.raises(InvalidRequestError,
                       match=r"keyword .\$ref. at #/\$defs/a .*no finite instance") as e:
        unroll_recursive_refs(endless)
    assert e.value.field == "json_schema"
    non_empty = {"type": "array", "minItems": 1, "items": {"$ref": "#"}}
    with pytest.raises(InvalidRequestError, match="no finite instance"):
        unroll_recursive_refs(non_empty)


def test_outlines_regex_no_longer_admits_the_broken_output(backends):
    import re

    regex = backends["outlines"].to_regex(GrammarKey.from_constraint("json_schema", LINKED))
    assert re.fullmatch(regex, BROKEN) is None
    assert re.fullmatch(regex, '{"v":1,"next":{"v":-2,"next":null}}')


@pytest.mark.parametrize("name", ["ref_ref_linked_list", "ref_ref_tree", "ref_ref_expression"])
def test_recursive_schemas_walk_to_valid_json(compiler, tokenizer, walker, name):
    schema = json.loads((SCHEMAS / f"{name}.json").read_text())
    key = GrammarKey.from_constraint("json_schema", schema)
    g = compiler.compile(key)
    assert not (feed_text(g, tokenizer, _spell(BROKEN, compiler.backend.name))
                and g.is_completed())
    assert walker.valid_walks(lambda: compiler.compile(key), schema, random.Random(7), 3,
                              max_steps=120) >= 1


def test_linked_list_at_the_bound_must_close_with_null(compiler, tokenizer):
    g = compiler.compile(GrammarKey.from_constraint("json_schema", LINKED))
    if compiler.backend.name != "outlines":  # xgrammar recurses without bound
        deep = _spell('{"v":1,"next":' * 6 + "null" + "}" * 6, "xgrammar")
        assert feed_text(g, tokenizer, deep) and g.is_completed()
        return
    prefix = '{"v":1,"next":' * 4 + '{"v":1,"next":'
    assert not feed_text(g, tokenizer, prefix)  # a fifth level is past the bound
    g = compiler.compile(GrammarKey.from_constraint("json_schema", LINKED))
    assert feed_text(g, tokenizer, '{"v":1,"next":' * 4 + "null" + "}" * 4)
    assert g.is_completed()


def test_impossible_items_after_a_prefix_close_the_array():
    pair = {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"$ref": "#"}}
    out = unroll_recursive_refs(pair, max_depth=1)
    assert out["items"]["items"] is False  # the nested array holds just its integer
    jsonschema.validate([1, [2]], out)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([1, [2, [3]]], out)


def test_shared_references_are_checked_in_linear_time():
    """40 definitions each using the next one twice: 2**40 paths, 40 references."""
    defs = {f"d{i}": {"type": "array", "prefixItems": [{"$ref": f"#/$defs/d{i + 1}"}] * 2}
            for i in range(40)}
    defs["d40"] = {"type": "integer"}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    assert not has_recursive_ref(schema)
    defs["d40"] = {"$ref": "#/$defs/d0"}
    assert has_recursive_ref(schema)

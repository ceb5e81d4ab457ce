"""Keywords a backend would silently ignore are rejected, naming keyword and location."""
from __future__ import annotations

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.arrays import UNIQUE_MARK
from sgdsl.runtime.grammar.schema.support import check_schema_support, walk_schema

NESTED = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True,
                                                    "items": {"type": "string"}}}}


def test_walk_reaches_nested_subschemas_not_property_names():
    found = {(p, k) for p, k, _ in walk_schema({
        "properties": {"minimum": {"type": "integer"}}, "anyOf": [{"if": {}}],
        "$defs": {"a": {"maximum": 3}}, "enum": [{"uniqueItems": 1}]})}
    assert ("#", "properties") in found and ("#/anyOf/0", "if") in found
    assert ("#/$defs/a", "maximum") in found and ("#/properties/minimum", "type") in found
    assert all(k != "uniqueItems" for _, k in found)  # enum values are data, not schemas
    assert all(k != "minimum" for _, k in found)  # a property called "minimum" is a name


@pytest.mark.parametrize("backend", ["xgrammar", "outlines"])
def test_unenforced_keyword_is_rejected_with_its_path(backend):
    with pytest.raises(InvalidRequestError, match=r"'uniqueItems' \(at #/properties/tags\)") as e:
        check_schema_support(backend, NESTED)
    assert e.value.field == "json_schema"
    # the normalizer hands items of any type to the runtime (grammar/guards/unique_items.py), marked
    tags = normalize_schema(NESTED, backend)["properties"]["tags"]
    assert "uniqueItems" not in tags and tags[UNIQUE_MARK] is True
    objects = {"type": "array", "uniqueItems": True, "items": {"type": "object"}}
    got = normalize_schema({"type": "object", "properties": {"tags": objects}}, backend)
    assert got["properties"]["tags"][UNIQUE_MARK] is True


def test_backends_differ_on_multiple_of_and_allof():
    bounded = {"type": "integer", "minimum": 0, "maximum": 9}
    check_schema_support("xgrammar", bounded)
    check_schema_support("outlines", bounded)  # spliced in as a range regex (outlines_bounds)
    with pytest.raises(InvalidRequestError, match="multipleOf"):
        check_schema_support("outlines", {"type": "integer", "multipleOf": 5})
    # allOf is merged by the normalizer; none may reach a backend
    assert normalize_schema({"allOf": [bounded, {"type": "integer", "maximum": 5}]}) == \
        {"type": "integer", "minimum": 0, "maximum": 5}
    with pytest.raises(InvalidRequestError, match="allOf"):
        check_schema_support("xgrammar", {"allOf": [bounded, {"type": "integer"}]})
    with pytest.raises(InvalidRequestError, match="'not'"):
        check_schema_support("xgrammar", {"not": bounded})  # xgrammar ignores it
    check_schema_support("outlines", {"type": "object", "title": "t", "description": "d"})

"""Bounded "any JSON value" for backends that compile a schema to a regex (outlines-core).

A regex cannot nest without bound, so outlines-core spells an untyped value (``{}``, an array
without ``items``, an object without ``properties``) as its own any-value regex, nested a few
levels. That regex is ambiguous enough that indexing it over a 49k vocabulary takes seconds
(``{"type": "object"}``: ~5 s) and an array of up to four untyped items took 164 s, past any
compile deadline. Here those positions are rewritten, before outlines sees the schema, into
``ANY_VALUE``: a primitive, or an array/object of primitives. It admits only JSON values, so
every output still validates against the original schema; it just nests less deeply.
"""
from __future__ import annotations

from typing import Any

_PRIMITIVES = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]
ANY_PRIMITIVE: dict = {"anyOf": _PRIMITIVES}
ANY_VALUE: dict = {"anyOf": _PRIMITIVES + [{"type": "array", "items": ANY_PRIMITIVE},
                                           {"type": "object",
                                            "additionalProperties": ANY_PRIMITIVE}]}
# "Any JSON object" (the json_object constraint): its values may be arrays/objects themselves.
ANY_OBJECT: dict = {"type": "object", "additionalProperties": ANY_VALUE}

# Keywords that say nothing about the instance: a schema made only of these accepts anything.
_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples", "$schema",
                          "$id", "$anchor", "deprecated", "readOnly", "writeOnly", "$defs",
                          "definitions"})
_NAMED = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SINGLE = ("items", "additionalProperties", "not", "contains", "if", "then", "else",
           "propertyNames", "unevaluatedProperties", "unevaluatedItems")


def is_untyped(node: Any) -> bool:
    """True for a schema that accepts every JSON value (``true``, ``{}``, annotations only)."""
    return node is True or isinstance(node, dict) and set(node) <= _ANNOTATIONS


def bound_untyped_values(node: Any) -> Any:
    """A copy of ``node`` with every untyped position replaced by ``ANY_VALUE`` (see above)."""
    if is_untyped(node):
        return {**ANY_VALUE, **_annotations_of(node)}
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _NAMED and isinstance(value, dict):
            out[key] = {name: bound_untyped_values(sub) for name, sub in value.items()}
        elif key in _LISTS and isinstance(value, list):
            out[key] = [bound_untyped_values(sub) for sub in value]
        elif key in _SINGLE and value is not False:
            out[key] = bound_untyped_values(value)
        else:
            out[key] = value
    return _fill_open_containers(out)


def _fill_open_containers(node: dict) -> dict:
    """An array without ``items`` or an object without ``properties`` holds untyped values."""
    kind = node.get("type")
    if kind == "array" and "items" not in node and "prefixItems" not in node:
        return {**node, "items": ANY_VALUE}
    open_object = kind == "object" and not node.get("properties") and \
        "patternProperties" not in node and "additionalProperties" not in node
    if open_object:
        return {**node, "additionalProperties": ANY_VALUE}
    return node


def _annotations_of(node: Any) -> dict:
    return {k: v for k, v in node.items() if k in ("title", "description")} \
        if isinstance(node, dict) else {}

"""``oneOf`` as the backends see it: an ``anyOf`` whose branches must not overlap.

Branches are usually disjoint by construction (different types, a ``const`` discriminator on a
required key, a key one requires and the other forbids); ``disjoint`` proves that cheaply. For a
closed object (``additionalProperties: false``) whose sibling branch requires a key it only
allows, the key is forbidden in it (``oneOf: [{required: [a]}, {required: [b]}]`` then means a
or b, not both): a subset of the branch, so sound. Overlap that cannot be proved away is left to
the output check (``validator.py``), which reports such an output as an error, never a success.
"""
from __future__ import annotations

from typing import Any

import jsonschema

from .merge import type_set


def make_exclusive(branches: list) -> tuple[list, bool]:
    """(each branch narrowed to exclude the *other original* branches where possible, True if
    every one then does)."""
    out = list(branches)
    for i in range(len(out)):
        for j, other in enumerate(branches):
            if i != j and not disjoint(out[i], other):
                out[i] = _forbid_others_key(out[i], other)
    exclusive = all(disjoint(out[i], other) for i in range(len(out))
                    for j, other in enumerate(branches) if i != j)
    return out, exclusive


def disjoint(a: Any, b: Any) -> bool:
    """True if no instance satisfies both plain schemas (False: unknown)."""
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    if "anyOf" in a or "anyOf" in b:
        return all(disjoint(x, y) for x in a.get("anyOf", [a]) for y in b.get("anyOf", [b]))
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not ta & tb:
        return True
    for one, other in ((a, b), (b, a)):
        if "enum" in one and not any(_valid(v, other) for v in one["enum"]):
            return True
    return _objects_disjoint(a, b) or _objects_disjoint(b, a)


def _types(node: dict) -> set | None:
    t = type_set(node)
    if t is None and "enum" in node:
        t = {_json_type(v) for v in node["enum"]}
    if t is not None and "number" in t:
        t = t | {"integer"}
    if t is not None and "integer" in t:
        t = t | {"number"}  # an integer is a number: only "number vs string" is disjoint
    return t


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


def _valid(value: Any, schema: dict) -> bool:
    if "$ref" in str(schema):
        return True  # unknown: assume it may overlap
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def _objects_disjoint(a: dict, b: dict) -> bool:
    """A key ``a`` requires is forbidden by ``b``, or both require it with disjoint values."""
    pa, pb = a.get("properties", {}), b.get("properties", {})
    for name in a.get("required", []):
        if _forbids(b, name):
            return True
        if name in b.get("required", []) and name in pa and name in pb and \
                disjoint(pa[name], pb[name]):
            return True
    return False


def _forbids(node: dict, name: str) -> bool:
    props = node.get("properties", {})
    if name in props:
        return props[name] is False
    return node.get("additionalProperties") is False and "patternProperties" not in node


def _forbid_others_key(mine: Any, other: Any) -> Any:
    """``mine`` with a key ``other`` requires (and ``mine`` only allows) forbidden."""
    if not isinstance(mine, dict) or not isinstance(other, dict) or "anyOf" in mine:
        return mine
    if mine.get("additionalProperties") is not False:
        return mine
    for name in other.get("required", []):
        if name not in mine.get("required", []) and name in mine.get("properties", {}):
            return {**mine, "properties": {**mine["properties"], name: False}}
    return mine

"""Subsumption between normal forms: ``implies(a, b)`` proves every instance of ``a`` is one of
``b`` (False: not proved), and ``drop_subsumed`` removes the ``anyOf`` branches another branch
contains. Dropping a branch inside another keeps the union exactly as it was, so this is no
narrowing; it keeps multiplied-out alternatives small. ``dependentSchemas`` that forbid one of a
list of keys each (``aql`` -> not all of ``pattern``, ``exclusions``...) multiply out to a branch
per key, most of them inside another once the other dependencies are merged in (JFrog's
filespec went past 64 alternatives that way).

The proof is structural and conservative: a keyword of ``b`` is implied when ``a`` has the same
value, a tighter bound, a superset of ``required``, a subset of ``type``/``enum``, property
schemas that imply ``b``'s (or forbid the key), or the keyword is one ``a``'s enum values all
satisfy. Anything else is "not proved".
"""
from __future__ import annotations

from typing import Any

import jsonschema

from .merge import LOWER, UPPER, canon, type_set

MAX_PROOFS = 20_000  # pairs compared per call (quadratic in the branches)
_OBJECT_SHAPE = ("additionalProperties", "patternProperties")


def drop_subsumed(branches: list) -> list:
    """``branches`` without those another kept branch contains (the first of equals stays)."""
    if len(branches) ** 2 > MAX_PROOFS:
        return branches
    kept: list = []
    for i, branch in enumerate(branches):
        inside = any(j != i and implies(branch, other) and
                     not (j > i and implies(other, branch))  # equal: the earlier one stays
                     for j, other in enumerate(branches))
        if not inside:
            kept.append(branch)
    return kept


def implies(a: Any, b: Any) -> bool:
    """True if every instance of normal form ``a`` is an instance of normal form ``b``."""
    if a is False or b == {} or b is True:
        return True
    if b is False or not isinstance(a, dict) or not isinstance(b, dict):
        return False
    if "anyOf" in a:
        return all(implies(x, b) for x in a["anyOf"])
    if "anyOf" in b:
        return any(implies(a, y) for y in b["anyOf"])
    if "$ref" in a or "$ref" in b:
        return canon(a) == canon(b)
    if set(a) == {"enum"} and "$ref" not in str(b):
        check = jsonschema.Draft202012Validator(b)
        return all(check.is_valid(v) for v in a["enum"])
    if any(k in b for k in _OBJECT_SHAPE) and not _unlisted_implied(a, b):
        return False
    return all(_keyword_implied(a, key, value) for key, value in b.items()
               if key not in _OBJECT_SHAPE)


def _keyword_implied(a: dict, key: str, value: Any) -> bool:
    if key in a and canon(a[key]) == canon(value):
        return True
    if key == "required":
        return set(value) <= set(a.get("required", []))
    if key == "type":
        mine, theirs = type_set(a), type_set({"type": value})
        return mine is not None and all(
            t in theirs or t == "integer" and "number" in theirs for t in mine)
    if key == "enum":
        return "enum" in a and {canon(v) for v in a["enum"]} <= {canon(v) for v in value}
    if key in LOWER:
        return key in a and a[key] >= value
    if key in UPPER:
        return key in a and a[key] <= value
    if key == "properties":
        return all(implies(_value_schema(a, name), schema) for name, schema in value.items())
    return False


def _value_schema(a: dict, name: str) -> Any:
    """What ``a`` allows as the value of key ``name`` (``False``: the key cannot occur; ``{}``
    where a pattern may match it: not worked out here, so only ``b`` allowing anything holds)."""
    if name in a.get("properties", {}):
        return a["properties"][name]
    if "patternProperties" in a:
        return {}
    return a.get("additionalProperties", {})


def _unlisted_implied(a: dict, b: dict) -> bool:
    """``b``'s rule for keys it does not list holds in ``a``: the same rule for the keys ``a``
    does not list either, and each key ``a`` lists but ``b`` does not is forbidden in ``a``
    or has a value ``b``'s ``additionalProperties`` accepts."""
    if any(canon(a.get(k)) != canon(b.get(k)) for k in _OBJECT_SHAPE):
        return False
    listed = b.get("properties", {})
    extra = b.get("additionalProperties", {})
    return all(s is False or "patternProperties" not in b and implies(s, extra)
               for name, s in a.get("properties", {}).items() if name not in listed)

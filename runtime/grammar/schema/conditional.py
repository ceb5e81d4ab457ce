"""``if``/``then``/``else``, ``not``, ``dependentRequired`` and ``dependentSchemas`` as lists of
alternatives (an ``anyOf`` the normalizer merges with the rest of the schema).

``if`` is negated when its negation can be spelled without ``not`` (see ``negate``): then the
rewrite is exact, ``(if and then) or (not-if and else)``. Otherwise ``(if and then) or (then and
else)`` stands in for it: smaller, still sound (an instance satisfying both ``then`` and ``else``
is valid whichever way ``if`` goes). "Property k absent" is written ``properties: {k: false}``;
the emitter drops the name (or the alternative, when the object may hold unlisted keys).
"""
from __future__ import annotations

from typing import Any

from .merge import canon, type_set

_TYPES = ("null", "boolean", "object", "array", "number", "string")
FORBID = False  # a property schema meaning "this key must not occur"


def if_then_else(cond: Any, then: Any, other: Any, context: dict) -> list:
    """Alternatives equivalent to (or, if ``cond`` cannot be negated, within) the conditional."""
    then = {} if then is None else then
    alts = [_all(cond, then)]
    negated = negate(cond, context)
    if negated is not None:
        return alts + [_all(n, other) for n in negated] if other is not None else alts + negated
    if other is None:
        return [then]
    return alts + [_all(then, other)]


def negate(node: Any, context: dict) -> list | None:
    """Plain schemas whose union is exactly the complement of ``node`` among the instances
    ``context`` allows, or None when that needs ``not``."""
    if node is False:
        return [{}]
    if node == {} or node is True:
        return []
    if set(node) <= {"type"}:
        return _negate_type(node)
    if set(node) <= {"type", "properties", "required"} and node.get("type", "object") == "object":
        return _negate_object(node, context)
    if set(node) == {"enum"}:
        rest = _domain_of(context)
        if rest is not None:
            banned = {canon(v) for v in node["enum"]}
            left = [v for v in rest if canon(v) not in banned]
            return [{"enum": left}] if left else []
    return None


def _negate_type(node: dict) -> list | None:
    allowed = type_set(node) or set()
    if "integer" in allowed and "number" not in allowed:
        return None  # "a number that is not an integer" has no spelling without not
    return [{"type": t} for t in _TYPES if t not in allowed]


def _negate_object(node: dict, context: dict) -> list | None:
    """Not an object (only if ``node`` demands one), or a required key absent, or a listed
    key present with a value its schema rejects."""
    alts: list = [{"type": t} for t in _TYPES if t != "object"] if "type" in node else []
    for name in node.get("required", []):
        alts.append({"type": "object", "properties": {name: FORBID}})
    props = context.get("properties", {})
    for name, sub in node.get("properties", {}).items():
        inner = negate(sub, props.get(name) if isinstance(props.get(name), dict) else {})
        if inner is None:
            return None
        alts += [{"type": "object", "properties": {name: alt}, "required": [name]}
                 for alt in inner]
    return alts


def _domain_of(node: Any) -> list | None:
    """The finite set of values ``node`` allows, or None."""
    if isinstance(node, dict) and "enum" in node:
        return list(node["enum"])
    if isinstance(node, dict) and node.get("type") == "boolean":
        return [False, True]
    return None


def dependencies(node: dict) -> list[tuple[str, list]]:
    """(keyword, alternatives) per ``dependentRequired``/``dependentSchemas`` entry."""
    lists: list[tuple[str, list]] = []
    for name, needed in node.get("dependentRequired", {}).items():
        lists.append(("dependentRequired",
                      [{"required": [name, *needed]}, {"properties": {name: FORBID}}]))
    for name, schema in node.get("dependentSchemas", {}).items():
        lists.append(("dependentSchemas",
                      [_all({"required": [name]}, schema), {"properties": {name: FORBID}}]))
    return lists


def _all(a: Any, b: Any) -> Any:
    """Marker for "both": the normalizer merges the pair (kept lazy so merging stays there)."""
    return ("allOf", a, b)

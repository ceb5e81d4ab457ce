"""``if``/``then``/``else``, ``not``, ``dependentRequired`` and ``dependentSchemas`` as lists of
alternatives (an ``anyOf`` the normalizer merges with the rest of the schema).

``if`` is negated when its negation can be spelled without ``not`` (see ``negation.py``): then the
rewrite is exact, ``(if and then) or (not-if and else)``. Otherwise ``(if and then) or (then and
else)`` stands in for it: smaller, still sound (an instance satisfying both ``then`` and ``else``
is valid whichever way ``if`` goes). "Property k absent" is written ``properties: {k: false}``;
the emitter drops the name (or the alternative, when the object may hold unlisted keys).
"""
from __future__ import annotations

from typing import Any

from .negation import FORBID


def if_then_else(cond: Any, then: Any, other: Any, negated: list | None) -> list:
    """Alternatives equivalent to (or, if ``cond`` has no ``negated`` form, within) the
    conditional."""
    then = {} if then is None else then
    alts = [_all(cond, then)]
    if negated is not None:
        return alts + [_all(n, other) for n in negated] if other is not None else alts + negated
    if other is None:
        return [then]
    return alts + [_all(then, other)]


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

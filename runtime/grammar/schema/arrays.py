"""Array keywords no backend enforces, rewritten into ones they do.

- ``uniqueItems``: with at most one item it says nothing. Items drawn from a small finite domain
  (``enum``/``const``/``boolean``/``null``) become an ``enum`` of the distinct-item arrays, in
  the domain's order (every one unique; a generator need not produce every permutation). Any
  other array keeps its items as they are, marked ``UNIQUE_MARK``: a grammar cannot remember
  which items it already emitted, so the runtime does (``grammar/unique_keys.py`` masks a token
  that would end an item JSON-equal to an earlier one: ``grammar/unique_items.py``).
- ``contains``: the first item must satisfy it (``prefixItems``), which implies the keyword.

Both are dropped where the node cannot be an array (``{"type": "string", "uniqueItems": true}``,
paper-plugin's authors): JSON Schema applies them to arrays only.
"""
from __future__ import annotations

from itertools import combinations
from math import comb
from typing import Any, Callable

from .merge import type_set
from .rejection import Impossible, reject

MAX_UNIQUE_ARRAYS = 256  # enum entries a uniqueItems expansion may produce
# Marks an array whose items the runtime keeps distinct (backends ignore x- keys).
UNIQUE_MARK = "x-sgdsl-unique-items"
Sub = Callable[[Any, Any, str], Any]
_ARRAY_ONLY = ("uniqueItems", "contains", "minContains", "maxContains")


def normalize_array(node: dict, path: str, sub: Sub) -> dict:
    types = type_set(node)
    if types is not None and "array" not in types:  # array keywords say nothing here
        return {k: v for k, v in node.items() if k not in _ARRAY_ONLY}
    if "contains" in node:
        node = _contains(node, path, sub)
    if node.get("uniqueItems") is not True:
        node.pop("uniqueItems", None)
        return node
    if node.get("maxItems", 2) <= 1:
        return {k: v for k, v in node.items() if k != "uniqueItems"}
    return _unique(node, path)


def _domain(items: Any) -> list | None:
    """The finite set of values ``items`` allows, or None."""
    if not isinstance(items, dict):
        return None
    if "enum" in items and set(items) == {"enum"}:
        return list(items["enum"])
    if set(items) == {"type"} and items["type"] in ("boolean", "null"):
        return [False, True] if items["type"] == "boolean" else [None]
    return None


def _unique(node: dict, path: str) -> dict:
    domain = _domain(node.get("items", {}))
    if domain is None or "prefixItems" in node:
        return {**{k: v for k, v in node.items() if k != "uniqueItems"}, UNIQUE_MARK: True}
    lo = node.get("minItems", 0)
    hi = min(node.get("maxItems", len(domain)), len(domain))
    if sum(comb(len(domain), k) for k in range(lo, hi + 1)) > MAX_UNIQUE_ARRAYS:
        # too many arrays to list: the runtime keeps the items distinct instead
        return {**{k: v for k, v in node.items() if k != "uniqueItems"}, UNIQUE_MARK: True}
    arrays = [list(c) for k in range(lo, hi + 1) for c in combinations(domain, k)]
    if not arrays:
        raise Impossible(path, "minItems exceeds the number of distinct items")
    return {"type": "array", "enum": arrays}



def _contains(node: dict, path: str, sub: Sub) -> dict:
    if node.get("minContains", 1) == 0:
        return {k: v for k, v in node.items() if k not in ("contains", "minContains")}
    if node.get("minContains", 1) != 1 or "maxContains" in node or "prefixItems" in node:
        raise reject("contains", path, "contains is enforced only with minContains 1, no "
                                       "maxContains and no prefixItems")
    out = {k: v for k, v in node.items() if k not in ("contains", "minContains")}
    first = sub(node.get("items", {}), node["contains"], f"{path}/contains")
    if first is False:
        raise Impossible(path, "no item satisfies contains")
    out["prefixItems"] = [first]
    out["minItems"] = max(1, node.get("minItems", 0))
    return out

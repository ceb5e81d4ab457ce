"""Array keywords no backend enforces, rewritten into ones they do.

- ``uniqueItems``: with at most one item it says nothing. Items drawn from a finite domain
  (``enum``/``const``/``boolean``/``null``, an integer range, a pattern with few matches like
  ``^[ab]$``, ``anyOf`` of those) become an ``enum`` of the distinct-item arrays, in the domain's
  order (every one unique; a generator need not produce every permutation), when those are few;
  ``minItems`` above the domain's size has no instance. Any other array keeps its items as they
  are, marked ``UNIQUE_MARK``: a grammar cannot remember which items it already emitted, so the
  runtime does (``grammar/guards/unique_keys.py`` masks a token that would end an item JSON-equal to an
  earlier one: ``grammar/guards/unique_items.py``). A finite domain too large to expand is written as
  the items' ``enum`` (an integer range stays one): the runtime reads it there and keeps every
  item one it can still finish distinctly (``grammar/guards/item_domain.py``), so all values used up
  never leaves an item open with nothing to end it.
- ``contains``: the first item must satisfy it (``prefixItems``), which implies the keyword.

Both are dropped where the node cannot be an array (``{"type": "string", "uniqueItems": true}``,
paper-plugin's authors): JSON Schema applies them to arrays only.
"""
from __future__ import annotations

from decimal import Decimal
from itertools import combinations
from math import comb
from typing import Any, Callable

import jsonschema

from .emit import implied_types
from .merge import type_set
from .pattern_values import pattern_values
from .rejection import Impossible, reject

MAX_UNIQUE_ARRAYS = 256  # enum entries a uniqueItems expansion may produce
MAX_DOMAIN = 256  # item values listed for a uniqueItems array (integer ranges: counted)
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


def canonical(value: Any) -> Any:
    """A hashable form of a JSON value, equal exactly when JSON Schema says equal: ``1`` and
    ``1.0`` (numbers as ``Decimal``; the runtime parses items that way), objects in any key
    order; ``true`` is not ``1``. Strings stay themselves (``JsonTrack.summary`` reads them)."""
    if isinstance(value, str):
        return value
    if value is True or value is False:
        return ("b", value)
    if value is None:
        return ("z",)
    if isinstance(value, Decimal):  # NOTE: Decimal("1.0") == Decimal("1"), hashes agree
        return ("n", value)
    if isinstance(value, (int, float)):  # a schema's number: a float by its repr
        return ("n", Decimal(repr(value)) if isinstance(value, float) else Decimal(value))
    if isinstance(value, list):
        return ("a", tuple(canonical(v) for v in value))
    return ("o", frozenset((k, canonical(v)) for k, v in value.items()))


def _domain(items: Any) -> list | None:
    """The distinct values ``items`` allows, as the backends emit them (a pattern matches the
    whole string), when at most ``MAX_DOMAIN``; None if unknown or more."""
    if not isinstance(items, dict) or "$ref" in items:
        return None
    if set(items) == {"anyOf"}:
        parts = [_domain(b) for b in items["anyOf"]]
        return None if None in parts else _distinct([v for p in parts for v in p])
    if set(items) == {"enum"}:
        return _distinct(items["enum"])
    kind = items.get("type")
    if kind is None and implied_types(items) == ["string"]:  # a pattern alone: emitted so
        kind = "string"
    if set(items) == {"type"} and kind in ("boolean", "null"):
        return [False, True] if kind == "boolean" else [None]
    if kind == "integer" and 0 <= _range_size(items) <= MAX_DOMAIN:
        values: list | None = list(range(items["minimum"], items["maximum"] + 1))
    elif kind == "string" and isinstance(items.get("pattern"), str):
        values = pattern_values(items["pattern"], MAX_DOMAIN)
    else:
        return None
    check = jsonschema.Draft202012Validator(items)  # the pattern's siblings, multipleOf...
    return None if values is None else [v for v in values if check.is_valid(v)]


def _range_size(items: dict) -> int:
    """How many integers ``items`` (an integer schema) bounds, -1 if unbounded."""
    if "minimum" not in items or "maximum" not in items:
        return -1
    return items["maximum"] - items["minimum"] + 1


def _is_range(items: Any) -> bool:
    """An integer range and nothing else: the runtime reads its domain as it is."""
    return isinstance(items, dict) and items.get("type") == "integer" and \
        set(items) == {"type", "minimum", "maximum"}


def _distinct(values: list) -> list | None:
    out = {canonical(v): v for v in reversed(values)}  # the first of equal values
    return list(reversed(out.values())) if len(out) <= MAX_DOMAIN else None


def _unique(node: dict, path: str) -> dict:
    items = node.get("items", {})
    whole = "prefixItems" not in node  # every item drawn from ``items``
    domain = _domain(items) if whole else None
    size = len(domain) if domain is not None else \
        _range_size(items) if whole and _is_range(items) else -1
    lo = node.get("minItems", 0)
    if size >= 0 and lo > size:
        raise Impossible(path, f"uniqueItems with minItems {lo}: items allow only {size} "
                               "distinct values", "uniqueItems")
    marked = {**{k: v for k, v in node.items() if k != "uniqueItems"}, UNIQUE_MARK: True}
    if domain is None:
        return marked
    hi = min(node.get("maxItems", len(domain)), len(domain))
    if sum(comb(len(domain), k) for k in range(lo, hi + 1)) <= MAX_UNIQUE_ARRAYS:
        return {"type": "array", "enum": [list(c) for k in range(lo, hi + 1)
                                          for c in combinations(domain, k)]}
    # NOTE: too many arrays to list: the runtime keeps the items distinct, reading the domain
    # from the items' enum (an integer range as it is: item_domain.py)
    if not _is_range(items):
        marked["items"] = {"enum": domain}
    return marked


def _contains(node: dict, path: str, sub: Sub) -> dict:
    if node.get("minContains", 1) == 0:
        return {k: v for k, v in node.items() if k not in ("contains", "minContains")}
    if node.get("minContains", 1) != 1 or "maxContains" in node or "prefixItems" in node:
        raise reject("contains", path, "contains is enforced only with minContains 1, no "
                                       "maxContains and no prefixItems")
    out = {k: v for k, v in node.items() if k not in ("contains", "minContains")}
    first = sub(node.get("items", {}), node["contains"], f"{path}/contains")
    if first is False:
        raise Impossible(path, "no item satisfies contains", "contains")
    out["prefixItems"] = [first]
    out["minItems"] = max(1, node.get("minItems", 0))
    return out

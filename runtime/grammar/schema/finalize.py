"""One plain schema made consistent after its keywords were gathered or merged: per-type
rewrites (integer bounds, strings, arrays), contradictions found (then ``Impossible``), and an
``enum``/``const`` reduced to the values its sibling keywords accept (then only the enum is
left, which every backend enforces exactly)."""
from __future__ import annotations

import math
from typing import Any, Callable

import jsonschema

from .arrays import normalize_array
from .merge import key_schema, type_set
from .rejection import Impossible, reject
from .strings import normalize_string

INT64 = (1 << 63) - 1
Sub = Callable[[Any, Any, str], Any]


def finalize(node: Any, path: str, sub: Sub) -> Any:
    if not isinstance(node, dict) or "anyOf" in node or "$ref" in node:
        return node
    node = dict(node)
    types = type_set(node)
    if types == {"integer"}:
        _integer_bounds(node, path)
    _check_ranges(node, path)
    if types is None or "string" in types:
        node = normalize_string(node, path)
    if "uniqueItems" in node or "contains" in node:
        node = normalize_array(node, path, sub)
    node = _array_positions(node, path)
    _check_object(node, path)
    _list_required(node, path, sub)
    if "enum" in node or "const" in node:
        return _enum_only(node, path)
    return node


def _integer_bounds(node: dict, path: str) -> None:
    """Whole, inclusive, int64 bounds (xgrammar refuses fractional ones and overflows)."""
    lo = [math.ceil(node.pop("minimum"))] if "minimum" in node else []
    hi = [math.floor(node.pop("maximum"))] if "maximum" in node else []
    if "exclusiveMinimum" in node:
        lo.append(math.floor(node.pop("exclusiveMinimum")) + 1)
    if "exclusiveMaximum" in node:
        hi.append(math.ceil(node.pop("exclusiveMaximum")) - 1)
    if lo and max(lo) > INT64 or hi and min(hi) < -INT64:
        raise reject("minimum" if lo else "maximum", path, "integer bounds beyond 64 bits")
    # NOTE: clamping to 64 bits narrows the range (sound); xgrammar cannot compare beyond it.
    if lo:
        node["minimum"] = max(max(lo), -INT64)
    if hi:
        node["maximum"] = min(min(hi), INT64)


def _check_ranges(node: dict, path: str) -> None:
    for lo, hi in (("minimum", "maximum"), ("minLength", "maxLength"),
                   ("minItems", "maxItems"), ("minProperties", "maxProperties")):
        if lo in node and hi in node and node[lo] > node[hi]:
            raise Impossible(path, f"{lo} {node[lo]} exceeds {hi} {node[hi]}", lo)
    lo = max([node[k] for k in ("minimum", "exclusiveMinimum") if k in node], default=None)
    hi = min([node[k] for k in ("maximum", "exclusiveMaximum") if k in node], default=None)
    if lo is not None and hi is not None and lo == hi and \
            ("exclusiveMinimum" in node or "exclusiveMaximum" in node):
        raise Impossible(path, "an empty exclusive range",
                        "exclusiveMinimum" if "exclusiveMinimum" in node else "exclusiveMaximum")


def _array_positions(node: dict, path: str) -> dict:
    """An impossible ``prefixItems`` position or ``items`` caps the array's length."""
    prefix = node.get("prefixItems")
    cap = None
    if prefix and False in prefix:
        cap = prefix.index(False)
        node["prefixItems"] = prefix[:cap]
    elif node.get("items") is False:
        cap = len(prefix or [])
    if cap is None:
        return node
    if node.get("minItems", 0) > cap:
        raise Impossible(path, "required array items cannot be satisfied", "minItems")
    node["maxItems"] = min(node.get("maxItems", cap), cap)
    node.pop("items", None)
    if not node.get("prefixItems"):
        node.pop("prefixItems", None)
    return node


def _check_object(node: dict, path: str) -> None:
    props = node.get("properties", {})
    closed = node.get("additionalProperties") is False and "patternProperties" not in node
    for name in node.get("required", []):
        if props.get(name, None) is False or (closed and name not in props):
            raise Impossible(path, f"required property {name!r} is not allowed", "required")
        if "propertyNames" in node and node["propertyNames"] is False:
            raise Impossible(path, "no property name is allowed", "propertyNames")


def _list_required(node: dict, path: str, sub: Sub) -> None:
    """A required name missing from ``properties`` becomes a listed property with the schema
    the node gives a key of that name (``merge.key_schema``: the ``patternProperties`` it
    matches, else ``additionalProperties``, else any value): the backends emit listed
    properties only (xgrammar skips a required name it has no property for, so ``{"required":
    ["username"]}`` beside other properties produced objects without it, and so did required
    names only a ``patternProperties`` pattern matched)."""
    required = node.get("required") or []
    props = node.get("properties") or {}
    missing = [n for n in required if isinstance(n, str) and n not in props]
    if missing:
        node["properties"] = {**props, **{n: key_schema(node, n, f"{path}/properties/{n}", sub)
                                          for n in missing}}


def _enum_only(node: dict, path: str) -> dict:
    values = [node["const"]] if "const" in node else list(node["enum"])
    if "const" in node and "enum" in node:
        values = [v for v in values if v in node["enum"]]
    rest = {k: v for k, v in node.items() if k not in ("enum", "const")}
    if rest:
        # NOTE: a recursive $ref is read as any value here: wider (a normal form has no
        # ``not``), so a value this rejects is out for sure; one it keeps may not be.
        check = jsonschema.Draft202012Validator(_refs_widened(rest))
        values = [v for v in values if check.is_valid(v)]
    if not values:
        raise Impossible(path, "no enum/const value satisfies the other keywords",
                         "const" if "const" in node else "enum")
    if "$ref" in str(rest):
        raise reject("enum", path, "enum/const beside a recursive $ref")
    return {"enum": values}


def _refs_widened(node: Any) -> Any:
    """``node`` with every subschema holding a ``$ref`` read as any value."""
    if isinstance(node, dict):
        if "$ref" in node:
            return {}
        return {k: v if k in ("enum", "const") else _refs_widened(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_refs_widened(v) for v in node]
    return node

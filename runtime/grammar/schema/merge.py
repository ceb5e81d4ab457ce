"""The intersection of two normalized schemas (``allOf``, or sibling keywords distributed into
an ``anyOf`` branch), keyword by keyword: types intersect, properties merge per name, required
lists unite, lower bounds take the larger and upper bounds the smaller value, enums intersect.
Two different values of a keyword with no known intersection are rejected, naming it."""
from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

from .pattern_meet import meet_pattern_keywords
from .rejection import Impossible, reject

LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_CHILD = ("additionalProperties", "items", "propertyNames")
Sub = Callable[[Any, Any, str], Any]  # merges two child schemas (any normal form)


def canon(value: Any) -> str:
    """A JSON value's identity under JSON Schema equality (1 == 1.0, true != 1)."""
    def fix(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v
    return json.dumps(fix(value), sort_keys=True)


def type_set(node: dict) -> set[str] | None:
    """The instance types ``node`` allows (None: any)."""
    t = node.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def intersect_types(a: Any, b: Any, path: str) -> Any:
    sa = {a} if isinstance(a, str) else set(a)
    sb = {b} if isinstance(b, str) else set(b)
    both = sa & sb
    if "integer" in sa and "number" in sb or "number" in sa and "integer" in sb:
        both.add("integer")
    if not both:
        raise Impossible(path, f"types {sorted(sa)} and {sorted(sb)} do not intersect", "type")
    return next(iter(both)) if len(both) == 1 else sorted(both)


def merge_plain(a: dict, b: dict, path: str, sub: Sub) -> dict:
    """Both schemas' keywords in one object (the caller re-checks its consistency)."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif key in ("properties", "patternProperties"):
            continue  # below, together with additionalProperties
        else:
            out[key] = _merge_keyword(key, out[key], value, path, sub)
    if any(k in a or k in b for k in ("properties", "patternProperties")):
        _merge_object_keys(a, b, out, path, sub)
    return out


def _merge_keyword(key: str, x: Any, y: Any, path: str, sub: Sub) -> Any:
    if canon(x) == canon(y):
        return x
    if key in LOWER:
        return max(x, y)
    if key in UPPER:
        return min(x, y)
    if key == "type":
        return intersect_types(x, y, path)
    if key == "required":
        return list(dict.fromkeys(list(x) + list(y)))
    if key == "enum":
        keep = {canon(v) for v in y}
        return [v for v in x if canon(v) in keep]
    if key == "const":
        raise Impossible(path, "two different const values", "const")
    if key == "uniqueItems":
        return bool(x or y)
    if key == "multipleOf":
        return _multiple_of(x, y, path)
    if key == "pattern":
        return meet_pattern_keywords(x, y, path)
    if key in _CHILD:
        return sub(x, y, f"{path}/{key}")
    if key == "prefixItems":
        n = min(len(x), len(y))
        return [sub(p, q, f"{path}/prefixItems/{i}") for i, (p, q) in
                enumerate(zip(x[:n], y[:n]))] + list(x[n:]) + list(y[n:])
    raise reject(key, path, "two different values meet in allOf or beside anyOf/oneOf "
                            "and their intersection cannot be expressed")


def _multiple_of(x: Any, y: Any, path: str) -> Any:
    if isinstance(x, int) and isinstance(y, int):
        return x * y // math.gcd(x, y)
    big, small = max(x, y), min(x, y)
    if (big / small).is_integer():
        return big
    raise reject("multipleOf", path, f"multipleOf {x} and {y} cannot be combined")


def _merge_object_keys(a: dict, b: dict, out: dict, path: str, sub: Sub) -> None:
    """``properties`` by name: each name gets what both sides give a key of that name (its
    property schema, else every ``patternProperties`` schema whose pattern it matches, else
    ``additionalProperties``). One side's ``patternProperties`` are kept as they are when the
    other side gives unlisted keys no schema (they then mean the same in the result), and
    dropped when it forbids them; anything else is rejected."""
    if "patternProperties" in a and "patternProperties" in b:
        raise reject("patternProperties", path, "patternProperties on both sides of a merge "
                                                "(allOf or beside anyOf/oneOf)")
    for mine, other in ((a, b), (b, a)):
        if "patternProperties" in mine:
            if other.get("additionalProperties") is False:
                out.pop("patternProperties", None)  # unlisted keys are forbidden anyway
            elif other.get("additionalProperties", {}) != {}:
                raise reject("patternProperties", path, "patternProperties merged with "
                                                        "additionalProperties on the other side")
    pa, pb = a.get("properties", {}), b.get("properties", {})
    props = {}
    for name in list(pa) + [n for n in pb if n not in pa]:
        where = f"{path}/properties/{name}"
        props[name] = sub(key_schema(a, name, where, sub), key_schema(b, name, where, sub),
                          where)
    if props:
        out["properties"] = props


def key_schema(node: dict, name: str, path: str, sub: Sub) -> Any:
    """The schema ``node`` gives the value of key ``name`` (JSON Schema searches the
    ``patternProperties`` patterns anywhere in the name, and applies every one that matches)."""
    matched = []
    for pattern, schema in (node.get("patternProperties") or {}).items():
        try:
            if re.search(pattern, name):
                matched.append(schema)
        except re.error as e:
            raise reject("patternProperties", path, f"the pattern does not parse: {e}") from None
    if name in node.get("properties", {}):
        out = node["properties"][name]
    else:
        out = {} if matched else node.get("additionalProperties", {})
    for schema in matched:
        out = sub(out, schema, path)
    return out

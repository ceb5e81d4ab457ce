"""``oneOf`` as the backends see it: an ``anyOf`` whose branches must not overlap.

Branches are usually disjoint by construction (different types, a ``const`` discriminator on a
required key, a key one requires and the other forbids); ``disjoint`` proves that cheaply. Where
it cannot, a branch is narrowed until it can (``_narrow``), each rewrite a subset of the branch:

- an ``enum`` loses the values another branch accepts (exact: such a value matches two
  branches, so oneOf rejects it); a branch left with none is dropped;
- a key both branches list with disjoint values (``shape: circle`` / ``shape: square``) is
  required (a discriminator the schema left optional);
- a closed object (``additionalProperties: false``, or listed properties only, which is all
  the backends emit anyway) forbids a key the other branch requires by name (``oneOf: [{required:
  [a]}, {required: [b]}]`` then means a or b, not both);
- a key the other branch forbids is required.

A narrowing is kept only where it proves the pair disjoint. Overlap that cannot be proved away
is left to the output check (``validator.py``), which reports such an output as an error, never
a success.

``disjoint(mine, other)`` is asymmetric: ``mine`` is a (narrowed) branch as it will be emitted
(``emit.implied_types`` types an untyped node), ``other`` an original branch read as JSON
Schema reads it (an untyped ``pattern`` accepts every number there).
"""
from __future__ import annotations

from typing import Any, Callable

import jsonschema

from .emit import implied_types
from .merge import type_set
from .pattern_start import starts_disjoint

_NUMBER = frozenset({"number", "integer"})
# (lower, upper) keyword pairs compared for disjoint ranges, per type
_COUNTS = {"string": ("minLength", "maxLength"), "array": ("minItems", "maxItems"),
           "object": ("minProperties", "maxProperties")}


def make_exclusive(branches: list) -> tuple[list, bool]:
    """(each branch narrowed to exclude the *other original* branches where possible, True if
    every one then does). A branch with no instance of its own left is dropped."""
    out = list(branches)
    for i in range(len(out)):
        for j, other in enumerate(branches):
            if i != j and out[i] is not False and not disjoint(out[i], other):
                out[i] = _narrow(out[i], other)
    exclusive = all(disjoint(out[i], other) for i in range(len(out))
                    for j, other in enumerate(branches) if i != j)
    return [b for b in out if b is not False], exclusive


def disjoint(mine: Any, other: Any) -> bool:
    """True if no instance of ``mine`` (as emitted) satisfies ``other`` (False: unknown)."""
    if mine is False or other is False:
        return True
    if not isinstance(mine, dict) or not isinstance(other, dict):
        return False
    if "anyOf" in mine or "anyOf" in other:
        return all(disjoint(x, y) for x in mine.get("anyOf", [mine])
                   for y in other.get("anyOf", [other]))
    tm, to = _types(mine, implied=True), _types(other, implied=False)
    if tm is not None and to is not None and not tm & to:
        return True
    for one, two in ((mine, other), (other, mine)):
        if "enum" in one and not any(_valid(v, two) for v in one["enum"]):
            return True
    return any(_only(tm, to, t) and rule(mine, other) for t, rule in _TYPED_RULES)


def _narrow(mine: Any, other: Any) -> Any:
    """``mine`` narrowed by the first rewrite that makes it disjoint from ``other``."""
    if not isinstance(mine, dict) or "anyOf" in mine:
        return mine
    for rewrite in (_drop_enum_values, _require_discriminator, _forbid_others_key,
                    _require_forbidden_key):
        narrowed = rewrite(mine, other)
        if narrowed is not mine and disjoint(narrowed, other):
            return narrowed
    return mine


# -- rewrites (each returns a subset of ``mine``, or ``mine`` itself) ----------------------------
def _drop_enum_values(mine: dict, other: Any) -> Any:
    if "enum" not in mine:
        return mine
    values = [v for v in mine["enum"] if not _valid(v, other)]
    if len(values) == len(mine["enum"]):
        return mine
    return {**mine, "enum": values} if values else False


def _require_discriminator(mine: dict, other: Any) -> dict:
    props, theirs = _props(mine), _props(other)
    for name, schema in props.items():
        if name in theirs and schema is not False and disjoint(schema, theirs[name]):
            return _require(mine, name)
    return mine


def _forbid_others_key(mine: dict, other: Any) -> dict:
    """A key ``other`` requires, forbidden in ``mine`` if ``mine`` is (or can say it is)
    closed: an open object cannot forbid one key in the backends' grammars."""
    props = _props(mine)
    closed = mine.get("additionalProperties") is False or (
        "additionalProperties" not in mine and props)
    if not closed or "patternProperties" in mine or not isinstance(other, dict):
        return mine
    for name in other.get("required", []):
        if name not in mine.get("required", []):
            # NOTE: the key is forbidden by name, the branch is not closed here: a sibling
            # merged into it later may still add keys (emit closes it at the very end; with
            # listed properties and no additionalProperties the backends emit no other key)
            return {**mine, "properties": {**props, name: False}}
    return mine


def _require_forbidden_key(mine: dict, other: Any) -> dict:
    for name, schema in _props(mine).items():
        if schema is not False and isinstance(other, dict) and _forbids(other, name):
            return _require(mine, name)
    return mine


def _require(node: dict, name: str) -> dict:
    required = node.get("required", [])
    return node if name in required else {**node, "required": [*required, name]}


# -- proofs --------------------------------------------------------------------------------------
def _objects_disjoint(a: dict, b: dict) -> bool:
    """A key one requires is forbidden by the other, or a key one requires is listed by both
    with disjoint values (the instance has it, so both schemas apply to it)."""
    pa, pb = _props(a), _props(b)
    for one, two in ((a, b), (b, a)):
        for name in one.get("required", []):
            if _forbids(two, name):
                return True
            if name in pa and name in pb and disjoint(pa[name], pb[name]):
                return True
    return False


def _ranges_disjoint(a: dict, b: dict) -> bool:
    """Number ranges that do not meet (an exclusive bound excludes its value)."""
    lo_a, hi_a, lo_b, hi_b = _low(a), _high(a), _low(b), _high(b)
    return _before(hi_a, lo_b) or _before(hi_b, lo_a)


def _counts_disjoint(kind: str) -> Callable[[dict, dict], bool]:
    lo, hi = _COUNTS[kind]

    def check(a: dict, b: dict) -> bool:
        return (hi in a and lo in b and a[hi] < b[lo]) or (hi in b and lo in a and b[hi] < a[lo])
    return check


def _patterns_disjoint(a: dict, b: dict) -> bool:
    """Anchored patterns whose first characters differ (``^success$`` / ``^fail$``)."""
    pa, pb = a.get("pattern"), b.get("pattern")
    return isinstance(pa, str) and isinstance(pb, str) and starts_disjoint(pa, pb)


# Rules that hold when every instance both schemas could share has one type.
_TYPED_RULES = (("object", _objects_disjoint), ("number", _ranges_disjoint),
                ("string", _patterns_disjoint),
                *((kind, _counts_disjoint(kind)) for kind in _COUNTS))


def _only(tm: set | None, to: set | None, kind: str) -> bool:
    want = _NUMBER if kind == "number" else {kind}
    return (tm is not None and tm <= want) or (to is not None and to <= want)


def _low(node: dict) -> tuple[float, bool] | None:
    keys = [(node[k], k.startswith("exclusive")) for k in ("minimum", "exclusiveMinimum")
            if isinstance(node.get(k), (int, float)) and not isinstance(node[k], bool)]
    return max(keys, key=lambda v: (v[0], v[1])) if keys else None


def _high(node: dict) -> tuple[float, bool] | None:
    keys = [(node[k], k.startswith("exclusive")) for k in ("maximum", "exclusiveMaximum")
            if isinstance(node.get(k), (int, float)) and not isinstance(node[k], bool)]
    return min(keys, key=lambda v: (v[0], not v[1])) if keys else None


def _before(hi: tuple | None, lo: tuple | None) -> bool:
    if hi is None or lo is None:
        return False
    return hi[0] < lo[0] or (hi[0] == lo[0] and (hi[1] or lo[1]))


def _types(node: dict, implied: bool) -> set | None:
    t = type_set(node)
    if t is None and "enum" in node:
        t = {_json_type(v) for v in node["enum"]}
    if t is None and implied:
        found = implied_types(node)
        t = None if found is None else set(found)
    if t is not None and t & _NUMBER:
        t = t | _NUMBER  # an integer is a number: only "number vs string" is disjoint
    return t


def _props(node: Any) -> dict:
    props = node.get("properties") if isinstance(node, dict) else None
    return props if isinstance(props, dict) else {}


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


def _valid(value: Any, schema: Any) -> bool:
    if "$ref" in str(schema):
        return True  # unknown: assume it may overlap
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def _forbids(node: dict, name: str) -> bool:
    props = _props(node)
    if name in props:
        return props[name] is False
    return node.get("additionalProperties") is False and "patternProperties" not in node

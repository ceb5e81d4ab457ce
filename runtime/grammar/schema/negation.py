"""``not`` spelled without ``not``: lists of schemas whose union is exactly the complement.

Two readings. ``negate_raw`` looks at the subschema as written, for forms whose normal form
would be narrower than the original (a negation of something narrower is wider, so unsound):
``not: {not: X}`` is ``X``, ``not: {items: {not: X}}`` is an array that ``contains`` X, and
``not: {pattern: "[...]"}`` (one character class, searched anywhere, as JSON Schema reads a
pattern) is a string made only of the other characters. ``negate`` takes a normal form, which
for the forms it handles is exact: types, enums (over what the context allows, or per type:
strings by ``string_complement``, numbers as the ranges between the excluded ones), length,
count and numeric bounds (each flipped), objects' ``properties``/``required``, and ``anyOf``
(the product of its branches' negations, when a ``merge`` is given). Anything else: None.

``negate`` is only sound on a normal form that is *exact*: the normalizer narrows some keywords
(formats and patterns, ``oneOf`` overlaps, ``uniqueItems``, ``contains``, inexact ``if``), and
the complement of a narrower schema is wider. ``exactly_normalized`` checks the subschema as
written uses none of those, so its normal form means what it says.
"""
from __future__ import annotations

from typing import Any, Callable

from ...errors import InvalidRequestError
from .merge import canon, type_set
from .patterns import Unfoldable, parse_pattern
from .drafts import to_2020_12
from .rejection import Impossible
from .string_complement import complement_regex
from .strings import ENFORCED_FORMATS

TYPES = ("null", "boolean", "object", "array", "number", "string")
FORBID = False  # a property schema meaning "this key must not occur"
MAX_PRODUCT = 64  # alternatives the negation of an anyOf may multiply out to
_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples",
                          "deprecated", "readOnly", "writeOnly", "$id", "$schema"})
# Bound keyword -> (the type it constrains, the keyword bounding the other side, offset)
_FLIPS = {"minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
          "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
          "minProperties": ("object", "maxProperties", -1),
          "maxProperties": ("object", "minProperties", 1),
          "minimum": ("number", "exclusiveMaximum", 0),
          "maximum": ("number", "exclusiveMinimum", 0),
          "exclusiveMinimum": ("number", "maximum", 0),
          "exclusiveMaximum": ("number", "minimum", 0)}
_CLASS_COMPLEMENTS = {r"\d": r"\D", r"\D": r"\d", r"\w": r"\W", r"\W": r"\w", r"\s": r"\S",
                      r"\S": r"\s"}
Merge = Callable[[Any, Any], Any]  # two normal forms' intersection (may raise Impossible)
# Keywords the normalizer rewrites without narrowing (merges, type and enum intersections,
# impossible branches dropped): a subschema made of these alone has an exact normal form.
_EXACT = frozenset({"type", "enum", "const", "required", "properties", "anyOf", "allOf", "not",
                    "$ref", "$defs", "definitions", "format", *_FLIPS})
_MAX_DEPTH = 32  # references followed while checking (a recursive one is not exact)


def exactly_normalized(raw: Any, resolve: Callable[[str], Any], depth: int = 0) -> bool:
    """Whether ``raw``'s normal form accepts exactly its instances (see the module doc)."""
    if isinstance(raw, bool):
        return True
    if not isinstance(raw, dict) or depth > _MAX_DEPTH:
        return False
    node = to_2020_12(raw)
    if not set(node) <= _EXACT or node.get("format") in ENFORCED_FORMATS:
        return False
    props = node.get("properties", {})
    kids = list(props.values()) if isinstance(props, dict) else [None]  # None: not exact
    for key in ("anyOf", "allOf"):
        if key in node:
            kids += node[key] if isinstance(node[key], list) else [None]
    if "not" in node:
        kids.append(node["not"])
    if "$ref" in node:
        try:
            kids.append(resolve(node["$ref"]))
        except InvalidRequestError:
            return False
    return all(exactly_normalized(k, resolve, depth + 1) for k in kids)


def negate_raw(raw: Any) -> list | None:
    """Raw schemas whose union is exactly ``not raw``, for the forms read as written."""
    node = _bare(raw)
    if node is None:
        return None
    if set(node) == {"not"}:
        return [node["not"]]
    inner = _bare(node.get("items"))
    if set(node) == {"items"} and inner is not None and set(inner) == {"not"}:
        return [{"type": "array", "contains": inner["not"]}]
    if "pattern" in node and set(node) <= {"pattern", "type"} and \
            node.get("type", "string") == "string":
        others = _other_char(node["pattern"])
        if others is not None:
            rest = [{"type": t} for t in TYPES if t != "string"] if "type" in node else []
            return rest + [{"type": "string", "pattern": f"^{others}*$"}]
    return None


def _bare(node: Any) -> dict | None:
    if not isinstance(node, dict):
        return None
    return {k: v for k, v in node.items() if k not in _ANNOTATIONS}


def _other_char(pattern: Any) -> str | None:
    """For a pattern of one character class (found anywhere: a string matches when it holds
    one such character), the class of all other characters."""
    try:
        tree = parse_pattern(pattern) if isinstance(pattern, str) else None
    except Unfoldable:
        return None
    if tree is None or tree.kind != "atom" or tree.text != pattern:
        return None  # anchored or more than one character: no simple complement
    if pattern in _CLASS_COMPLEMENTS:
        return _CLASS_COMPLEMENTS[pattern]
    if pattern.startswith("[^"):
        return f"[{pattern[2:]}"
    if pattern.startswith("["):
        return f"[^{pattern[1:]}"
    if pattern.isascii() and pattern.isalnum():
        return f"[^{pattern}]"
    return None


def negate(node: Any, context: dict, merge: Merge | None = None) -> list | None:
    """Plain schemas whose union is exactly the complement of the normal form ``node`` among
    the instances ``context`` allows, or None when that needs ``not``."""
    if node is False:
        return [{}]
    if node == {} or node is True:
        return []
    if set(node) == {"anyOf"}:
        return _negate_any(node["anyOf"], context, merge)
    if set(node) <= {"type", "properties", "required"} and set(node) != {"type"} and \
            node.get("type", "object") == "object":
        return _negate_object(node, context, merge)
    if set(node) == {"enum"}:
        return _negate_enum(node["enum"], context)
    return _negate_bounds(node)


def _bound_keys(node: dict) -> set:
    return set(node) - {"type"}


def _negate_any(branches: list, context: dict, merge: Merge | None) -> list | None:
    """Not any branch: every branch's negation at once (their pairwise intersections)."""
    lists = [negate(b, context, merge) for b in branches]
    if any(alts is None for alts in lists) or (merge is None and len(lists) > 1):
        return None
    out: list = [{}]
    for alts in lists:
        both = []
        for a in out:
            for b in alts:
                try:
                    m = a if b == {} else b if a == {} else merge(a, b)
                except Impossible:
                    continue
                except InvalidRequestError:
                    return None  # an intersection the normalizer cannot spell
                if m is not False:
                    both.append(m)
        if len(both) > MAX_PRODUCT:
            return None
        out = both
    return out


def _negate_bounds(node: dict) -> list | None:
    """Not one of the types, or one of them with a bound broken (types alone included)."""
    keys = _bound_keys(node)
    if not keys <= set(_FLIPS):
        return None
    allowed = type_set(node) or set(TYPES)
    if "integer" in allowed and "number" not in allowed:
        return None  # "a number that is not an integer" has no spelling without not
    alts: list = [{"type": t} for t in TYPES if t not in allowed]
    for key in sorted(keys):
        family, other, step = _FLIPS[key]
        value = node[key]
        if family in allowed and not (step < 0 and value <= 0):  # else nothing breaks it
            alts.append({"type": family, other: value + step})
    return alts


def _negate_object(node: dict, context: dict, merge: Merge | None) -> list | None:
    """Not an object (only if ``node`` demands one), or a required key absent, or a listed
    key present with a value its schema rejects."""
    alts: list = [{"type": t} for t in TYPES if t != "object"] if "type" in node else []
    for name in node.get("required", []):
        alts.append({"type": "object", "properties": {name: FORBID}})
    props = context.get("properties", {})
    for name, sub in node.get("properties", {}).items():
        inner = negate(sub, props.get(name) if isinstance(props.get(name), dict) else {}, merge)
        if inner is None:
            return None
        alts += [{"type": "object", "properties": {name: alt}, "required": [name]}
                 for alt in inner]
    return alts


def _negate_enum(values: list, context: dict) -> list | None:
    rest = domain_of(context)
    if rest is not None:
        banned = {canon(v) for v in values}
        left = [v for v in rest if canon(v) not in banned]
        return [{"enum": left}] if left else []
    allowed = type_set(context) or set(TYPES)
    alts: list = []
    for t in TYPES + ("integer",):
        if t in allowed and not (t == "integer" and "number" in allowed):
            others = _outside(t, values)
            if others is None:
                return None
            alts += others
    return alts


def _outside(t: str, values: list) -> list | None:
    """Schemas for the values of type ``t`` that are not among ``values``."""
    if t == "null":
        return [] if None in values else [{"type": "null"}]
    if t == "boolean":
        left = [b for b in (False, True) if not any(v is b for v in values)]
        return [{"type": "boolean"}] if len(left) == 2 else [{"enum": left}] if left else []
    if t in ("number", "integer"):
        nums = sorted({v for v in values if isinstance(v, (int, float))
                       and not isinstance(v, bool)})
        return _number_gaps(t, nums)
    if t == "string":
        banned = [v for v in values if isinstance(v, str)]
        if not banned:
            return [{"type": "string"}]
        regex = complement_regex(banned)
        return None if regex is None else [{"type": "string", "pattern": regex}]
    kind = dict if t == "object" else list
    return None if any(isinstance(v, kind) for v in values) else [{"type": t}]


def _number_gaps(t: str, nums: list) -> list:
    """The ranges of type ``t`` between the excluded numbers (inclusive integer bounds)."""
    if t == "integer":
        ints = sorted({int(n) for n in nums if float(n).is_integer()})
        edges = [None] + ints + [None]
        gaps = [(None if lo is None else lo + 1, None if hi is None else hi - 1)
                for lo, hi in zip(edges, edges[1:])]
        return [{"type": "integer", **({"minimum": lo} if lo is not None else {}),
                 **({"maximum": hi} if hi is not None else {})}
                for lo, hi in gaps if lo is None or hi is None or lo <= hi]
    edges = [None] + nums + [None]
    return [{"type": "number", **({"exclusiveMinimum": lo} if lo is not None else {}),
             **({"exclusiveMaximum": hi} if hi is not None else {})}
            for lo, hi in zip(edges, edges[1:])]


def domain_of(node: Any) -> list | None:
    """The finite set of values ``node`` allows, or None."""
    if isinstance(node, dict) and "enum" in node:
        return list(node["enum"])
    if isinstance(node, dict) and node.get("type") == "boolean":
        return [False, True]
    return None

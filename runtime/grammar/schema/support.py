"""Which JSON Schema keywords each backend really enforces, so none is dropped silently.

Checked on the *normalized* schema (``schema/normalizer.py`` has already rewritten ``allOf``,
conditionals, dependencies, ``contains``, ``uniqueItems``, formats and draft-04 forms). Both
compilers accept keywords they ignore (tested against xgrammar 0.2.8 and outlines-core 0.2.14:
xgrammar ignores ``not``, ``uniqueItems``, ``contains``, ``if``, ``dependentRequired``,
multi-branch ``allOf``, and length bounds beside a ``pattern``; outlines-core also numeric
bounds (``outlines_bounds.py`` splices them in), ``multipleOf`` and property counts). What is
left of those is rejected naming the keyword and where it is; annotations (``title``,
``description``...) are fine.
"""
from __future__ import annotations

from typing import Any, Iterator

from ...errors import InvalidRequestError

# Keys whose value maps names to subschemas, or lists subschemas, or is one subschema.
NAMED = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SINGLE = ("items", "additionalProperties", "not", "contains", "if", "then", "else",
           "propertyNames", "unevaluatedProperties", "unevaluatedItems")

_COMMON_UNSUPPORTED = frozenset({
    "uniqueItems", "contains", "minContains", "maxContains", "if", "then", "else",
    "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef", "not", "allOf", "dependencies"})
UNSUPPORTED: dict[str, frozenset[str]] = {
    "xgrammar": _COMMON_UNSUPPORTED,
    # NOTE: outlines-core ignores numeric bounds too; outlines_bounds.py splices them in
    "outlines": _COMMON_UNSUPPORTED | {
        "multipleOf", "propertyNames", "patternProperties",
        # NOTE: outlines-core builds the object regex without counting properties, so these
        # were silently ignored (an instance with 1 property passed minProperties: 2).
        "minProperties", "maxProperties"},
}


def walk_schema(node: Any, path: str = "#") -> Iterator[tuple[str, str, Any]]:
    """(path, keyword, value) for every keyword of every subschema."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        yield path, key, value
        if key in NAMED and isinstance(value, dict):
            for name, sub in value.items():
                yield from walk_schema(sub, f"{path}/{key}/{name}")
        elif key in LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from walk_schema(sub, f"{path}/{key}/{i}")
        elif key in SINGLE:
            yield from walk_schema(value, f"{path}/{key}")


# NOTE: outlines-core spells a bound as a regex repetition and builds its DFA: maxLength 1024
# takes ~6 s to index, 10000 ~80 s. xgrammar compiles any bound in about 2 s.
OUTLINES_MAX_BOUND = 1024
_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems")


def check_schema_support(backend: str, schema: Any) -> None:
    """Raise ``InvalidRequestError(field="json_schema")`` naming the first keyword ``backend``
    cannot enforce (``schema`` is normalized: see the module doc)."""
    unsupported = UNSUPPORTED.get(backend, frozenset())
    for path, key, value in walk_schema(schema):
        if backend == "outlines" and key in _BOUNDS and isinstance(value, (int, float)) \
                and value > OUTLINES_MAX_BOUND:
            raise InvalidRequestError(
                f"the outlines grammar backend enforces json_schema {key} up to "
                f"{OUTLINES_MAX_BOUND} (at {path}: {value}); use the xgrammar backend",
                field="json_schema")
        if key in unsupported:
            raise InvalidRequestError(
                f"the {backend} grammar backend cannot enforce json_schema keyword {key!r} "
                f"(at {path}); remove it or use another grammar backend", field="json_schema")

"""Which JSON Schema keywords each backend really enforces, so none is dropped silently.

Both compilers accept schemas with keywords they ignore (xgrammar: ``uniqueItems``, ``contains``,
``if``/``then``/``else``, ``dependentRequired``, multi-branch ``allOf``; outlines-core also
numeric bounds and ``multipleOf``). A request using one is rejected at admission with a message
naming the keyword and where it is; annotations (``title``, ``description``...) are fine.
"""
from __future__ import annotations

from typing import Any, Iterator

from ..errors import InvalidRequestError

# Keys whose value maps names to subschemas, or lists subschemas, or is one subschema.
_NAMED = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SINGLE = ("items", "additionalProperties", "not", "contains", "if", "then", "else",
           "propertyNames", "unevaluatedProperties", "unevaluatedItems")

_COMMON_UNSUPPORTED = frozenset({
    "uniqueItems", "contains", "minContains", "maxContains", "if", "then", "else",
    "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef"})
UNSUPPORTED: dict[str, frozenset[str]] = {
    "xgrammar": _COMMON_UNSUPPORTED,
    "outlines": _COMMON_UNSUPPORTED | {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "propertyNames", "allOf", "not", "patternProperties",
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
        if key in _NAMED and isinstance(value, dict):
            for name, sub in value.items():
                yield from walk_schema(sub, f"{path}/{key}/{name}")
        elif key in _LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from walk_schema(sub, f"{path}/{key}/{i}")
        elif key in _SINGLE:
            yield from walk_schema(value, f"{path}/{key}")


def check_schema_support(backend: str, schema: Any) -> None:
    """Raise ``InvalidRequestError(field="json_schema")`` naming the first keyword ``backend``
    cannot enforce."""
    unsupported = UNSUPPORTED.get(backend, frozenset())
    for path, key, value in walk_schema(schema):
        bad = key in unsupported or (
            backend == "xgrammar" and key == "allOf" and isinstance(value, list) and len(value) > 1)
        if bad:
            raise InvalidRequestError(
                f"the {backend} grammar backend cannot enforce json_schema keyword {key!r} "
                f"(at {path}); remove it or use another grammar backend", field="json_schema")

"""Numeric bounds for the outlines backend: outlines-core's schema compiler ignores ``minimum``,
``maximum`` and the exclusive forms, so each bounded integer or number is swapped for a
placeholder string constant before it compiles the schema, and the placeholder's spelling in
the regex it returns is then replaced by the exact range regex (``number_range.py``).

A placeholder is a constant no schema text contains (checked), so its quoted spelling occurs in
the regex only where that node was. A bound that cannot be spelled (a fractional bound on a
``number``, or bounds beside ``enum``) is rejected naming the keyword and path.
"""
from __future__ import annotations

from typing import Any

from ...errors import InvalidRequestError
from .number_range import bounds_of, integer_regex, number_regex
from ..schema.support import LISTS, NAMED, SINGLE

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_NUMERIC = ("integer", "number")


class BoundSplicer:
    """Collects one schema's placeholders (``swap``), then puts the ranges in (``splice``)."""

    def __init__(self, schema_text: str) -> None:
        self.prefix = "sgdslrange"
        while self.prefix in schema_text:
            self.prefix += "x"
        self.ranges: dict[str, str] = {}  # placeholder -> range regex

    def swap(self, node: Any, path: str = "#") -> Any:
        """``node`` with every bounded numeric subschema replaced by a placeholder."""
        if not isinstance(node, dict):
            return node
        out = {k: self._child(k, v, path) for k, v in node.items()}
        if not any(k in out for k in BOUNDS):
            return out
        return self._placeholder(out, path)

    def splice(self, regex: str) -> str:
        for name, rng in self.ranges.items():
            regex = regex.replace(f'"{name}"', f"({rng})")
        return regex

    def _child(self, key: str, value: Any, path: str) -> Any:
        if key in NAMED and isinstance(value, dict):
            return {n: self.swap(s, f"{path}/{key}/{n}") for n, s in value.items()}
        if key in LISTS and isinstance(value, list):
            return [self.swap(s, f"{path}/{key}/{i}") for i, s in enumerate(value)]
        if key in SINGLE:
            return self.swap(value, f"{path}/{key}")
        return value

    def _placeholder(self, node: dict, path: str) -> dict:
        types = node.get("type")
        types = [types] if isinstance(types, str) else list(types or [])
        numeric = [t for t in types if t in _NUMERIC]
        keyword = next(k for k in BOUNDS if k in node)
        if not numeric or "enum" in node or "const" in node:
            raise _reject(keyword, path, "bounds are enforced here only on a typed "
                          "integer or number without enum/const")
        try:
            rng = (number_regex if "number" in numeric else integer_regex)(*bounds_of(node))
        except ValueError as e:
            raise _reject(keyword, path, f"{e} (number bounds must be whole numbers)") from None
        if rng is None:
            raise _reject(keyword, path, "no number lies within the bounds")
        name = f"{self.prefix}{len(self.ranges)}"
        self.ranges[name] = rng
        rest = [t for t in types if t not in _NUMERIC]
        if not rest:
            return {"const": name}
        others = {k: v for k, v in node.items() if k not in BOUNDS}
        others["type"] = rest[0] if len(rest) == 1 else rest
        return {"anyOf": [{"const": name}, others]}


def _reject(keyword: str, path: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"the outlines grammar backend cannot enforce json_schema keyword "
                               f"{keyword!r} at {path}: {why}; use the xgrammar backend",
                               field="json_schema")

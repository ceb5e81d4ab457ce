"""How the normalizer says no: a request error naming the keyword and its JSON path, and the
internal signal that a subschema has no instance at all."""
from __future__ import annotations

from ...errors import InvalidRequestError


def reject(keyword: str, path: str, why: str) -> InvalidRequestError:
    """The admission error for a keyword that cannot be enforced (raise it)."""
    return InvalidRequestError(
        f"json_schema keyword {keyword!r} at {path} cannot be enforced: {why}",
        field="json_schema")


class Impossible(Exception):
    """A subschema accepts no instance. Callers that can drop it (an ``anyOf`` branch, an
    optional property) do; at the root it becomes a request error naming ``keyword`` (the
    one found unsatisfiable; ``false``: a false subschema) at ``path``."""

    def __init__(self, path: str, why: str, keyword: str = "(schema)") -> None:
        super().__init__(f"{why} (at {path}, {keyword})")
        self.path = path
        self.why = why
        self.keyword = keyword


# After these keywords comes a property name (or a definition's), or a list index: no keyword.
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions",
                    "dependentSchemas", "dependentRequired", "dependencies"})
_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_DATA = frozenset({"enum", "const", "required", "type", "examples", "default"})


def keyword_at(parts: list) -> tuple[str, str]:
    """(keyword, path of the schema object holding it) for a JSON path into a schema (parts
    as keys and indices, or as the strings of a "#/..." path) that ends at or inside a
    keyword's value: ``["properties", "x", "enum", 1]`` gives ``("enum", "#/properties/x")``;
    a path that names no keyword gives ``("(schema)", "#")``."""
    keyword, holder, i = "(schema)", len(parts), 0
    while i < len(parts):
        part = parts[i]
        keyword, holder = str(part), i
        if part in _DATA:
            break
        nested = i + 1 < len(parts) and (part in _NAMED or part in _LISTS
                                         and str(parts[i + 1]).isdigit())
        i += 2 if nested else 1
    return keyword, "/".join(["#", *(str(p).replace("~", "~0").replace("/", "~1")
                                     for p in parts[:holder])])

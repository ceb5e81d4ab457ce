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
    optional property) do; at the root it becomes a request error."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{why} (at {path})")
        self.path = path
        self.why = why

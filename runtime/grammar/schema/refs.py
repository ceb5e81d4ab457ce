"""Local ``$ref`` resolution for the normalizer: JSON pointers into the document (``#``,
``#/$defs/a``, ``#/definitions/a``, ``#/properties/x``) and ``$anchor``/``$id`` names are not
supported (rejected). A reference that can reach itself is recursive: the normalizer keeps it
as a reference to a definition instead of inlining it forever; every other one is inlined."""
from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from .rejection import reject


class RefTable:
    def __init__(self, root: Any) -> None:
        self.root = root
        self._names: dict[str, str] = {}
        self._recursive: dict[str, bool] = {}

    def is_recursive(self, ref: str, path: str) -> bool:
        """True if following references from ``ref``'s target can come back to ``ref``."""
        if ref not in self._recursive:
            seen: set[str] = set()
            todo = list(refs_in(self.resolve(ref, path)))
            while todo and ref not in seen:
                nxt = todo.pop()
                if nxt not in seen:
                    seen.add(nxt)
                    todo += refs_in(self.resolve(nxt, path))
            self._recursive[ref] = ref in seen
        return self._recursive[ref]

    def resolve(self, ref: str, path: str) -> Any:
        if not ref.startswith("#"):
            raise reject("$ref", path, f"only local references (#/...) are supported, not {ref!r}")
        node = self.root
        for part in ref[1:].split("/")[1:] if ref not in ("#", "#/") else []:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            try:
                node = node[int(part)] if isinstance(node, list) else node[part]
            except (KeyError, IndexError, ValueError, TypeError):
                raise reject("$ref", path, f"{ref!r} does not resolve") from None
        return node

    def def_name(self, ref: str) -> str:
        """A stable ``$defs`` name for a recursive reference."""
        if ref not in self._names:
            self._names[ref] = f"r{len(self._names)}"
        return self._names[ref]


_DATA = frozenset({"enum", "const", "default", "examples", "required", "$defs", "definitions"})


def refs_in(node: Any) -> list[str]:
    """Local references applied within ``node`` (not inside definitions or data keywords)."""
    found: list[str] = []
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            found.append(ref)
        for key, value in node.items():
            if key not in _DATA and key != "$ref":
                found += refs_in(value)
    elif isinstance(node, list):
        for value in node:
            found += refs_in(value)
    return found

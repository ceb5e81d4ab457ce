"""Bounded unrolling of recursive ``$ref`` schemas, for backends that compile to a regex.

A regex cannot recurse, so outlines-core unrolls a recursive ``$ref`` a few levels itself, but at
its depth limit it substitutes an empty pattern and keeps the property's separator: for a
required recursive property (a linked list's ``"next"``) its regex accepts ``{"v":1,}``, which
is not JSON. This module does the unrolling before outlines sees the schema, soundly: a
reference nested deeper than ``max_depth`` is *impossible*, and impossibility propagates the
way JSON Schema says it must:

- an ``anyOf``/``oneOf`` branch that is impossible is dropped (no branch left: impossible);
- an optional property is dropped, a required one makes its object impossible;
- array ``items`` that are impossible leave only the ``prefixItems`` or the empty array (unless
  ``minItems`` asks for more: impossible);
- ``additionalProperties`` that are impossible become ``false``;
- anything else (``allOf``, ``prefixItems``...) that is impossible makes its schema impossible.

The result accepts only instances of the original schema (those within the depth bound). A
schema with no instance within the bound (every path recurses) is rejected with a message.
Schemas without a recursive reference are returned unchanged.
"""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from ...errors import InvalidRequestError
from ..schema.refs import refs_in

MAX_DEPTH = 4  # expansions of one reference on the current path (outlines-core's own is ~4)
MAX_NODES = 20_000  # unrolled schema size; a wide recursive schema grows as width**depth
_DATA_KEYS = frozenset({"enum", "const", "default", "examples", "required"})
_DEF_KEYS = frozenset({"$defs", "definitions"})
_IMPOSSIBLE = object()  # "no instance within the depth bound"


def unroll_schema_text(text: str, max_depth: int = MAX_DEPTH) -> str:
    """``text`` unchanged when it has no recursive local ``$ref``; else the unrolled schema."""
    schema = json.loads(text)
    if not has_recursive_ref(schema):
        return text
    return json.dumps(unroll_recursive_refs(schema, max_depth))


def has_recursive_ref(schema: Any) -> bool:
    """True if following local ``$ref``s from the root can reach the same reference again."""
    # NOTE: a depth-first search with per-reference state, linear in the references: walking
    # every path instead is exponential when definitions share references (a DAG).
    state: dict[str, bool] = {}  # True: on the current path; False: finished, no cycle

    def visit(node: Any) -> bool:
        for ref in refs_in(node):
            if ref in state:
                if state[ref]:
                    return True
                continue
            state[ref] = True
            target = _resolve(schema, ref, missing_ok=True)
            if target is not None and visit(target):
                return True
            state[ref] = False
        return False
    return visit(schema)


def unroll_recursive_refs(schema: Any, max_depth: int = MAX_DEPTH) -> Any:
    """Every local ``$ref`` inlined, recursion cut at ``max_depth`` (see the module doc)."""
    unroller = _Unroller(schema, max_depth)
    out = unroller.expand(schema, ())
    if out is _IMPOSSIBLE:
        raise InvalidRequestError(
            f"json_schema keyword '$ref' at {unroller.cut} (a definition that refers to "
            f"itself) cannot be enforced by outlines: the schema has no finite instance "
            f"within {max_depth} levels of this recursion (every branch recurses again)",
            field="json_schema")
    return out


def _resolve(schema: Any, ref: str, missing_ok: bool = False) -> Any:
    """The subschema a local JSON-pointer reference (``#``, ``#/$defs/a``) names."""
    node = schema
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            if missing_ok:
                return None
            raise InvalidRequestError(f"json_schema keyword '$ref' cannot be enforced: "
                                      f"{ref!r} does not resolve (no {ref} in the schema)",
                                      field="json_schema") from None
    return node


class _Unroller:
    """One unrolling pass; ``stack`` is the chain of references being expanded."""

    def __init__(self, root: Any, max_depth: int) -> None:
        self.root = root
        self.max_depth = max_depth
        self.nodes = 0
        self.cut = ""  # the last reference cut at the depth bound (for the error message)

    def expand(self, node: Any, stack: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise InvalidRequestError(
                f"json_schema keyword '$ref' at {stack[-1] if stack else '#'} (a recursive "
                f"definition) cannot be enforced by outlines: the schema is too large once "
                f"its recursive $refs are unrolled {self.max_depth} levels (over {MAX_NODES} "
                f"subschemas)", field="json_schema")
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return self._expand_ref(node, ref, stack)
        return self._expand_keywords(node, stack)

    def _expand_ref(self, node: dict, ref: str, stack: tuple[str, ...]) -> Any:
        if stack.count(ref) >= self.max_depth:
            self.cut = ref
            return _IMPOSSIBLE
        target = self.expand(_resolve(self.root, ref), stack + (ref,))
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        if target is _IMPOSSIBLE or not siblings:
            return target
        rest = self._expand_keywords(siblings, stack)
        if rest is _IMPOSSIBLE:
            return _IMPOSSIBLE
        # NOTE: keywords beside a $ref apply together with it (2020-12); merging them is exact
        # when they do not overlap, which is the case in practice (annotations, a type).
        return {**target, **rest} if isinstance(target, dict) else target

    def _expand_keywords(self, node: dict, stack: tuple[str, ...]) -> Any:
        out: dict[str, Any] = {}
        items_impossible = False
        for key, value in node.items():
            if key in _DEF_KEYS:
                continue  # every local $ref is inlined: the definitions are not needed
            if key in _DATA_KEYS:
                out[key] = value
            elif key == "properties" and isinstance(value, dict):
                out[key] = self._properties(node, value, stack)
            elif key in ("anyOf", "oneOf") and isinstance(value, list):
                branches = [b for b in (self.expand(v, stack) for v in value)
                            if b is not _IMPOSSIBLE]
                out[key] = branches or _IMPOSSIBLE
            elif key == "items" and isinstance(value, dict):
                out[key] = self.expand(value, stack)
                items_impossible = out[key] is _IMPOSSIBLE
            elif key == "additionalProperties" and isinstance(value, dict):
                extra = self.expand(value, stack)
                out[key] = False if extra is _IMPOSSIBLE else extra
            else:
                out[key] = self._generic(value, stack)
        if items_impossible:  # only the prefix (or the empty array) is left, if allowed
            prefix = len(node.get("prefixItems") or ())
            if node.get("minItems", 0) > prefix:
                return _IMPOSSIBLE
            if prefix:
                out["items"] = False
            else:
                del out["items"]
                out["maxItems"] = 0
        return _IMPOSSIBLE if any(v is _IMPOSSIBLE for v in out.values()) else out

    def _properties(self, node: dict, props: dict, stack: tuple[str, ...]) -> Any:
        required = set(node.get("required") or ())
        out = {}
        for name, sub in props.items():
            expanded = self.expand(sub, stack)
            if expanded is _IMPOSSIBLE:
                if name in required:
                    return _IMPOSSIBLE
                continue  # an optional property that cannot occur is simply left out
            out[name] = expanded
        return out

    def _generic(self, value: Any, stack: tuple[str, ...]) -> Any:
        """A keyword without special rules: subschemas inside it must all be possible."""
        if isinstance(value, dict):
            return self.expand(value, stack)
        if isinstance(value, list):
            items = [self._generic(v, stack) for v in value]
            return _IMPOSSIBLE if any(v is _IMPOSSIBLE for v in items) else items
        return value

"""The last pass: the normal form spelled for the backends. A property schema ``false``
("this key must not occur") is dropped from ``properties``, which forbids the key because the
backends never emit unlisted keys unless ``additionalProperties``/``patternProperties`` allow
them (``additionalProperties: false`` is then written out); where those do, the branch holding
the forbidden key is dropped instead (a subset).

A node without ``type`` whose keywords belong to some types only (``pattern``, ``minimum``,
``minItems``...) gets those types (``_typed``): xgrammar ignores such keywords on an untyped
node (``{"format": "ipv4"}`` let the model write any string, then the output check caught
``"bindAddr": "backend-cole"``) and outlines-core refuses the node. JSON Schema lets every other
type through there, so this narrows (sound); xgrammar already reads an untyped ``properties``
node as an object, and the other types are hardly what such a schema asks for (an IP address
written as ``28``). Done here, at the end: narrowing before ``allOf`` merges could turn a
satisfiable schema into an impossible one."""
from __future__ import annotations

import re
from typing import Any

from .rejection import Impossible

_NAMED = ("properties", "patternProperties", "$defs")
_SINGLE = ("additionalProperties", "items", "propertyNames")
# Keywords that constrain one type only (the rest, like uniqueItems and contains, are rewritten
# before this pass; an unenforced format is an annotation).
_TYPE_KEYWORDS = {
    "string": ("pattern", "minLength", "maxLength"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("items", "prefixItems", "minItems", "maxItems"),
    "object": ("properties", "patternProperties", "additionalProperties", "required",
               "minProperties", "maxProperties", "propertyNames"),
}


def emit(node: Any, path: str) -> Any:
    if not isinstance(node, dict):
        return node
    if "anyOf" in node:
        branches = []
        for i, b in enumerate(node["anyOf"]):
            try:
                branches.append(emit(b, f"{path}/anyOf/{i}"))
            except Impossible:
                continue
        if not branches:
            raise Impossible(path, "no anyOf branch is satisfiable", "anyOf")
        return branches[0] if len(branches) == 1 else {"anyOf": branches}
    out = dict(node)
    for key in _NAMED:
        if isinstance(node.get(key), dict):
            out[key] = {n: _child(s, f"{path}/{key}/{n}") for n, s in node[key].items()}
    for key in _SINGLE:
        if key in node:
            out[key] = _child(node[key], f"{path}/{key}")
    if "prefixItems" in node:
        out["prefixItems"] = [emit(s, f"{path}/prefixItems/{i}")
                              for i, s in enumerate(node["prefixItems"])]
    _drop_forbidden(out, path)
    _open_for_count(out, path)
    return _typed(out)


def _typed(node: dict) -> dict:
    """``node`` with the types its type-specific keywords apply to, if it names none."""
    types = implied_types(node)
    if not types or "type" in node:
        return node
    return {"type": types[0] if len(types) == 1 else types, **node}


def implied_types(node: dict) -> list[str] | None:
    """The types an untyped plain node is emitted with (None: it stays any value). ``oneof.py``
    relies on it to prove branches disjoint as the backends will read them."""
    if any(k in node for k in ("type", "$ref", "enum", "const", "anyOf")):
        return None
    types = [t for t, words in _TYPE_KEYWORDS.items() if any(w in node for w in words)]
    return types or None


def _child(node: Any, path: str) -> Any:
    """An optional position: impossible means forbidden (``False``)."""
    try:
        return emit(node, path)
    except Impossible:
        return False


def _open_for_count(node: dict, path: str) -> None:
    """An object that needs more keys than it lists gets them from ``additionalProperties``:
    the backends emit no unlisted key unless it is spelled out (xgrammar refuses ``{"type":
    "object", "minProperties": 2}`` as unsatisfiable), while JSON Schema allows any there, so
    spelling it ``{}`` is exact. Duplicate keys, which would count twice, are the open-key
    guard's (``unique_keys.py``)."""
    need = node.get("minProperties", 0)
    listed = sum(s is not False for s in (node.get("properties") or {}).values())
    types = node.get("type", "object")
    if not isinstance(need, int) or need <= listed or "patternProperties" in node or \
            "object" not in (types if isinstance(types, list) else [types]):
        return
    if node.get("additionalProperties", {}) is False:
        raise Impossible(path, f"minProperties {need} but only {listed} keys are allowed",
                         "minProperties")
    node.setdefault("additionalProperties", {})


def _drop_forbidden(node: dict, path: str) -> None:
    props = node.get("properties")
    if not isinstance(props, dict):
        return
    banned = [n for n, s in props.items() if s is False]
    if not banned:
        return
    extra = node.get("additionalProperties", False) is not False
    patterns = list((node.get("patternProperties") or {}).keys())
    for name in banned:
        if name in node.get("required", []):
            raise Impossible(path, f"required property {name!r} is not allowed", "required")
        if extra or any(re.search(p, name) for p in patterns):
            raise Impossible(path, f"property {name!r} must not occur, but unlisted keys may",
                             "properties")
        del props[name]
    # NOTE: the backends emit no unlisted key anyway; saying so keeps the emitted schema a
    # subset of the original under JSON Schema's own reading too.
    node["additionalProperties"] = False
    if not props:
        del node["properties"]

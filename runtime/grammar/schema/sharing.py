"""Identical pattern strings compiled once: xgrammar builds every occurrence of a subschema
anew, but a ``$ref`` target once. A ``{0,128}`` pattern costs ~0.55 s to compile, so a schema
with ten such fields took 5.5 s inline and 0.55 s with the ten pointing at one definition
(measured with xgrammar 0.2.8; Snowplow sp_153, with ~25 bounded fields, missed the 10 s
deadline). A string subschema with a ``pattern`` (bounds and formats are patterns by now) that
occurs twice or more moves to ``$defs`` and each occurrence becomes a ``$ref`` to it: the same
instances, one compile.
"""
from __future__ import annotations

import json
from typing import Any

_DATA = ("enum", "const", "required", "default", "examples")
_PREFIX = "sgdsl_shared_"


def share_patterns(root: Any) -> Any:
    """``root`` with repeated pattern-string subschemas behind one ``$defs`` entry each."""
    if not isinstance(root, dict):
        return root
    counts: dict[str, int] = {}
    _count(root, counts, top=True)
    repeated = sorted(text for text, n in counts.items() if n > 1)
    if not repeated:
        return root
    defs = dict(root.get("$defs") or {})
    names = {}
    for i, text in enumerate(repeated):
        name = f"{_PREFIX}{i}"
        while name in defs:
            name += "_"
        names[text], defs[name] = name, json.loads(text)
    out = _replace(root, names, top=True)
    out["$defs"] = defs
    return out


def _shareable(node: dict) -> bool:
    return node.get("type") == "string" and isinstance(node.get("pattern"), str) and \
        not any(k.startswith("x-sgdsl") for k in node)


def _count(node: Any, counts: dict[str, int], top: bool = False) -> None:
    if isinstance(node, list):
        for v in node:
            _count(v, counts)
        return
    if not isinstance(node, dict):
        return
    if not top and _shareable(node):
        text = json.dumps(node, sort_keys=True)
        counts[text] = counts.get(text, 0) + 1
        return
    for k, v in node.items():
        if k not in _DATA:
            _count(v, counts)


def _replace(node: Any, names: dict[str, str], top: bool = False) -> Any:
    if isinstance(node, list):
        return [_replace(v, names) for v in node]
    if not isinstance(node, dict):
        return node
    if not top and _shareable(node):
        name = names.get(json.dumps(node, sort_keys=True))
        return {"$ref": f"#/$defs/{name}"} if name else node
    return {k: (v if k in _DATA else _replace(v, names)) for k, v in node.items()}

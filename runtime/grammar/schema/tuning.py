"""Per-backend spellings of the normal form: equivalent (or narrower) schemas that one backend
compiles much faster or enforces where it would otherwise ignore a keyword.

- xgrammar: a plain string with ``maxLength <= FAST_BOUND`` becomes a pattern over plain
  characters. xgrammar compiles a maxLength in ~2 s idle (6-7 s on a loaded 2-core box) whatever
  its value, the same bound as a pattern in 0.1-0.4 s from 256 to 512 (2 s at 1024, and
  slower below 256 too, still under the native form). The pattern leaves out escapes and
  control characters: a subset, so sound.
- outlines: an integer range of at most ``MAX_ENUM_RANGE`` values becomes an ``enum`` (outlines
  ignores minimum/maximum; an enum it enforces exactly; wider ranges are spliced into its regex
  by ``outlines_bounds.py``). A ``format``
  left (not one of the eight spelled as patterns) is dropped: JSON Schema makes it an
  annotation, the output check does not assert it, and outlines-core raises on most of them.
"""
from __future__ import annotations

import re
from typing import Any, Callable

FAST_BOUND = 512
MAX_ENUM_RANGE = 128
_PLAIN_CHARS = r'[^"\\\x00-\x1f]'
_DATA = ("enum", "const", "required")


def tune_for_backend(node: Any, backend_name: str) -> Any:
    rewrite = {"xgrammar": _fast_strings, "outlines": _for_outlines}.get(backend_name)
    return _walk(node, rewrite) if rewrite else node


def _walk(node: Any, rewrite: Callable[[dict], dict]) -> Any:
    if isinstance(node, list):
        return [_walk(v, rewrite) for v in node]
    if not isinstance(node, dict):
        return node
    return rewrite({k: (v if k in _DATA else _walk(v, rewrite)) for k, v in node.items()})


# NOTE: xgrammar 0.2.8 mis-reads an optional group whose body ends in a quantifier:
# "^a(\.[0-9]+)?b$" accepts "a0b" (found by the output check); "(...){0,1}" is read right.
_OPTIONAL_GROUP = re.compile(r"(?<!\\)\)\?(?![?+])")


def _fast_strings(node: dict) -> dict:
    if isinstance(node.get("pattern"), str):
        node = {**node, "pattern": _OPTIONAL_GROUP.sub("){0,1}", node["pattern"])}
    if node.get("type") != "string" or {"pattern", "format", "enum"} & set(node):
        return node
    hi = node.get("maxLength")
    if not isinstance(hi, int) or not 0 <= hi <= FAST_BOUND:
        return node
    out = {k: v for k, v in node.items() if k not in ("minLength", "maxLength")}
    out["pattern"] = f"^{_PLAIN_CHARS}{{{node.get('minLength', 0)},{hi}}}$"
    return out


def _for_outlines(node: dict) -> dict:
    if "format" in node:
        node = {k: v for k, v in node.items() if k != "format"}
    if node.get("type") != "integer" or set(node) - {"type", "minimum", "maximum"}:
        return node
    lo, hi = node.get("minimum"), node.get("maximum")
    if lo is None or hi is None or hi - lo + 1 > MAX_ENUM_RANGE:
        return node
    return {"enum": list(range(int(lo), int(hi) + 1))}

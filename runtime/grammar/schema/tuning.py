"""Per-backend spellings of the normal form: equivalent (or narrower) schemas that one backend
compiles much faster or enforces where it would otherwise ignore a keyword.

- xgrammar: a plain string with ``maxLength <= FAST_BOUND`` becomes a pattern over plain
  characters (larger bounds are left to the runtime by ``lengths.py``). xgrammar compiles a
  native maxLength in ~0.3 s at 64 and ~2 s from 256 up; the pattern compiles in 0.06-0.6 s up
  to 128 and fills a row in ~8 us. (From 256 the pattern compiles in 0.02 s but fills a row in
  ~11 ms: xgrammar stops unrolling it.) The pattern leaves out escapes and control characters:
  a subset, so sound. Repeated pattern strings then share one definition (``sharing.py``).
- outlines: an integer range of at most ``MAX_ENUM_RANGE`` values becomes an ``enum`` (outlines
  ignores minimum/maximum; an enum it enforces exactly; wider ranges are spliced into its regex
  by ``outlines_bounds.py``). A ``format``
  left (not one of the eight spelled as patterns) is dropped: JSON Schema makes it an
  annotation, the output check does not assert it, and outlines-core raises on most of them.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from .sharing import share_patterns

FAST_BOUND = 128  # = lengths.GRAMMAR_MAX: see the module doc
MAX_ENUM_RANGE = 128
_PLAIN_CHARS = r'[^"\\\x00-\x1f]'
_DATA = ("enum", "const", "required")


def tune_for_backend(node: Any, backend_name: str) -> Any:
    rewrite = {"xgrammar": _fast_strings, "outlines": _for_outlines}.get(backend_name)
    out = _walk(node, rewrite) if rewrite else node
    return share_patterns(out) if backend_name == "xgrammar" else out


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

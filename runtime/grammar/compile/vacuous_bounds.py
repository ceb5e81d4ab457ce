"""Upper bounds no output of a request can reach are dropped before the size limits apply.

Real schemas cap strings and arrays generously (``maxLength: 1000000`` for a free-text field);
such a number is above what the compiler may be asked to build (``limits.max_schema_bound``)
but says nothing about an output of ``max_new_tokens`` tokens: even if every token were the
vocabulary's longest, the whole output would be shorter than the bound, so no value inside it can
exceed it. Those bounds are removed from the request's schema (the same rewrite for every request
they are vacuous for, so the compile cache still shares it); any other over-limit bound is left
for ``limits.py`` to reject, naming it.
"""
from __future__ import annotations

import json
from typing import Any

UPPER = ("maxLength", "maxItems", "maxProperties", "maxContains")
_DATA = frozenset({"enum", "const", "default", "examples", "required"})


def longest_token_bytes(tokenizer: Any) -> int:
    """An upper bound on the characters one token can add (its piece's length in bytes)."""
    return max((len(p.encode("utf-8")) for p in tokenizer.get_vocab()), default=1)


def drop_vacuous_bounds(text: str, limit: int, reach: int) -> str:
    """``text`` (a json_schema) without upper bounds above ``limit`` that exceed ``reach``, the
    most characters the request's output can have; ``text`` itself if there are none."""
    try:
        schema = json.loads(text)
    except ValueError:
        return text  # limits.py names the error
    changed = [False]
    out = _strip(schema, max(limit, reach), changed)
    return json.dumps(out) if changed[0] else text


def _strip(node: Any, floor: int, changed: list) -> Any:
    if isinstance(node, list):
        return [_strip(v, floor, changed) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in UPPER and isinstance(v, (int, float)) and not isinstance(v, bool) and v > floor:
            changed[0] = True
            continue
        out[k] = v if k in _DATA else _strip(v, floor, changed)
    return out

"""Harmless slips a schema may carry, taken out before its meta-schema check: repeated values
in ``enum`` (the draft-03/04 meta-schemas demand unique ones), ``required`` and ``type`` (every
draft does). A repeat changes no instance's validity, so such a schema is served as if each
value were written once rather than rejected (validators do the same with it)."""
from __future__ import annotations

from typing import Any

from .merge import canon

_UNIQUE = ("enum", "required", "type")
# Values that are data, not subschemas: nothing inside them is a keyword.
_DATA = frozenset({"enum", "const", "examples", "default", "required", "type"})
# Keys whose value maps names to subschemas (a name there is no keyword).
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions",
                    "dependentSchemas"})


def without_repeats(node: Any) -> Any:
    """``node`` with every repeated ``enum``/``required``/``type`` value kept once (the first);
    ``node`` itself when it has none."""
    if isinstance(node, list):
        items = [without_repeats(v) for v in node]
        return node if all(a is b for a, b in zip(items, node)) else items
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _UNIQUE and isinstance(value, list):
            out[key] = _once(value)
        elif key in _NAMED and isinstance(value, dict):
            subs = {name: without_repeats(sub) for name, sub in value.items()}
            out[key] = value if all(subs[n] is value[n] for n in value) else subs
        else:
            out[key] = value if key in _DATA else without_repeats(value)
    return node if all(out[k] is node[k] for k in node) else out


def _once(values: list) -> list:
    seen: set[str] = set()
    kept = [v for v in values if not (canon(v) in seen or seen.add(canon(v)))]
    return values if len(kept) == len(values) else kept

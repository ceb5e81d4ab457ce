"""JSON-safe ``pattern``s for the outlines backend.

outlines-core puts a string's ``pattern`` between the quotes of its regex as written, but the
regex runs over JSON *text*: a ``.`` or a negated class there also matches ``"``, ``\\`` and raw
control characters, so ``{"v": {"pattern": "^a.*$"}}`` accepted ``{"v":"abc","x":"y"}`` (the
output check then failed the request: Snowplow sp_336). Each pattern is rewritten to match
only text that spells a value the pattern matches:

- ``.``, every class and ``\\D``/``\\W``/``\\S`` are intersected with the characters a JSON string
  may hold raw (no quote, backslash or control character): values with escapes are left out,
  a subset, so sound; ``\\s`` keeps its non-control spaces.
- a literal quote or backslash in the pattern (``"``, ``\\"``, ``\\\\``) is spelled as its JSON
  escape, and ``\\n``/``\\t``/``\\r``/``\\f`` likewise.
- ``[`` inside a class is a literal (ECMA-262), escaped for outlines-core's dialect, where it
  would open a nested class.
"""
from __future__ import annotations

from typing import Any

from ..schema.support import LISTS, NAMED, SINGLE

_RAW = r'[^"\\\x00-\x1f]'  # a character a JSON string holds unescaped
_SAFE = {".": _RAW, r"\D": rf"[\D&&{_RAW}]", r"\W": rf"[\W&&{_RAW}]",
         r"\S": rf"[\S&&{_RAW}]", r"\s": r"[\s&&[^\x00-\x1f]]", '"': r'\\"',
         r'\"': r'\\"', "\\\\": r"\\\\", r"\n": r"\\n", r"\t": r"\\t", r"\r": r"\\r",
         r"\f": r"\\f"}


def safe_patterns(node: Any) -> Any:
    """``node`` (a schema) with every string ``pattern`` rewritten (see the module doc)."""
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in NAMED and isinstance(value, dict):
            value = {k: safe_patterns(v) for k, v in value.items()}
        elif key in LISTS and isinstance(value, list):
            value = [safe_patterns(v) for v in value]
        elif key in SINGLE:
            value = safe_patterns(value)
        elif key == "pattern" and isinstance(value, str):
            value = json_text_pattern(value)
        out[key] = value
    return out


def json_text_pattern(pattern: str) -> str:
    """``pattern`` over string values as a regex over their JSON text (see the module doc)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "[":
            body, i = _class(pattern, i)
            out.append(f"[{body}&&{_RAW}]")
            continue
        piece = pattern[i:i + 2] if pattern[i] == "\\" else pattern[i]
        out.append(_SAFE.get(piece, piece))
        i += len(piece)
    return "".join(out)


def _class(pattern: str, start: int) -> tuple[str, int]:
    """(the class opened at ``start`` as outlines-core reads it, the index after it): a ``[``
    inside and a ``]`` first in it are literals, escaped."""
    i, body = start + 1, ["["]
    if pattern.startswith("^", i):
        body.append("^")
        i += 1
    first = True
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            body.append(pattern[i:i + 2])
            i += 2
        elif c == "]" and not first:
            body.append("]")
            return "".join(body), i + 1
        else:
            body.append("\\" + c if c in "[]" else c)
            i += 1
        first = False
    raise ValueError(f"unterminated character class in pattern {pattern!r}")

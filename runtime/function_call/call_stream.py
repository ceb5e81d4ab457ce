"""Streaming one grammar-constrained call object, ``{"name": "...", "<args_key>": {...}}``:
the name as soon as it is complete, then the arguments' JSON text piece by piece.

The streamed pieces concatenate to exactly ``arguments_text(final output)``, the value the
non-streamed answer carries, so a client that joins the deltas gets the same call.
"""
from __future__ import annotations

import json
import re

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def arguments_text(text: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a complete call object, or None if it is not one."""
    m = _HEAD.match(text)
    if m is None:
        return None
    body = text.rstrip()
    if not body.endswith("}"):
        return None
    return json.loads(m.group(1)), body[m.end():-1].rstrip()


def partial_arguments(text: str) -> tuple[str, str] | None:
    """(name, arguments text so far) of a call object cut short, or None before its name."""
    m = _HEAD.match(text)
    return None if m is None else (json.loads(m.group(1)), text[m.end():])


class CallStreamer:
    """Feed the cumulative call text; ``name`` appears once known, ``push`` returns the new
    arguments text that is safe to send (never the object's own closing brace)."""

    def __init__(self) -> None:
        self.name: str | None = None
        self._args_start = -1
        self._sent = 0  # characters of arguments text already returned

    def push(self, text: str) -> str:
        if self.name is None:
            m = _HEAD.match(text)
            if m is None or m.end() == len(text):  # the arguments' first character not yet
                return ""
            self.name, self._args_start = json.loads(m.group(1)), m.end()
        # NOTE: a trailing "}" (and the whitespace before it) may be the object's own end;
        # it is held back until more text shows it belonged to the arguments.
        body = text[self._args_start:]
        safe = len(body.rstrip())
        if safe and body[safe - 1] == "}":
            safe = len(body[:safe - 1].rstrip())
        return self._take(body, max(safe, self._sent))

    def finish(self, text: str) -> str:
        """The rest of the arguments once the output is complete."""
        done = arguments_text(text)
        if done is None or self.name is None:
            return ""
        return self._take(done[1], len(done[1]))

    def _take(self, body: str, end: int) -> str:
        piece = body[self._sent:end]
        self._sent = end
        return piece

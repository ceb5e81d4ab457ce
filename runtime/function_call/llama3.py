"""Llama-3.x: the whole answer is a call, ``{"name": ..., "parameters": {...}}`` (several
separated by ``;``), optionally after ``<|python_tag|>``. Anything else is normal text."""
from __future__ import annotations

import json

from .base import ParseResult, ToolCall, ToolCallFormat, decode_json_prefix

PYTHON_TAG = "<|python_tag|>"


class Llama3Format(ToolCallFormat):
    name = "llama3"
    opener = PYTHON_TAG
    forced_prefix = ""
    args_key = "parameters"

    def parse(self, text: str) -> ParseResult:
        head, tag, body = text.partition(PYTHON_TAG)
        if not tag:
            head, body = "", text
        calls = self._calls(body)
        if calls is None:
            return ParseResult(text)
        return ParseResult(head, tuple(calls))

    def _calls(self, body: str) -> list[ToolCall] | None:
        """All-or-nothing: ``body`` must be calls separated by ';' and nothing else."""
        calls: list[ToolCall] = []
        rest = body
        while rest.strip():
            decoded = decode_json_prefix(rest)
            if decoded is None:
                return None
            call = self.call_from_value(decoded[0])
            if call is None:
                return None
            calls.append(call)
            rest = rest[decoded[1]:].lstrip()
            if rest.startswith(";"):
                rest = rest[1:]
            elif rest.strip():
                return None
        return calls or None

    def render_calls(self, calls) -> str:
        return "; ".join(json.dumps(self._call_dict(c), ensure_ascii=False) for c in calls)

"""Mistral: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers) or
``[TOOL_CALLS]name[ARGS]{...}`` (v11+), after any normal text."""
from __future__ import annotations

import json

from .base import ParseResult, ToolCall, ToolCallFormat, decode_json_prefix

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralFormat(ToolCallFormat):
    name = "mistral"
    opener = TOOL_CALLS
    forced_prefix = TOOL_CALLS + " ["

    def parse(self, text: str) -> ParseResult:
        head, tag, body = text.partition(TOOL_CALLS)
        if not tag:
            return ParseResult(text)
        calls = self._array_calls(body) if body.lstrip().startswith("[") \
            else self._args_calls(body)
        if calls is None:
            return ParseResult(text)
        return ParseResult(head, tuple(calls))

    def _array_calls(self, body: str) -> list[ToolCall] | None:
        decoded = decode_json_prefix(body)
        if decoded is None or body[decoded[1]:].strip() or not isinstance(decoded[0], list):
            return None
        calls = [self.call_from_value(v) for v in decoded[0]]
        return None if not calls or any(c is None for c in calls) else calls  # type: ignore

    def _args_calls(self, body: str) -> list[ToolCall] | None:
        calls = []
        for part in body.split(TOOL_CALLS):
            name, sep, args = part.partition(ARGS)
            decoded = decode_json_prefix(args) if sep else None
            if decoded is None or args[decoded[1]:].strip() or not name.strip():
                return None
            call = self.call_from_value({"name": name.strip(), "arguments": decoded[0]})
            if call is None:
                return None
            calls.append(call)
        return calls

    def render_calls(self, calls) -> str:
        return TOOL_CALLS + " " + json.dumps([self._call_dict(c) for c in calls],
                                             ensure_ascii=False)

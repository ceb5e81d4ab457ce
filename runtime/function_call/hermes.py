"""Hermes / Qwen2.5 / Qwen3: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
one block per call, any text around them."""
from __future__ import annotations

import json

from .base import ParseResult, ToolCall, ToolCallFormat, decode_json_prefix

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesFormat(ToolCallFormat):
    name = "hermes"
    opener = OPEN
    forced_prefix = OPEN + "\n"
    closer = "\n" + CLOSE + "\n"

    def parse(self, text: str) -> ParseResult:
        normal: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while (start := text.find(OPEN, pos)) >= 0:
            end = text.find(CLOSE, start)
            body = text[start + len(OPEN):end if end >= 0 else len(text)]
            call = self._block_call(body)
            if call is None:  # not a call: keep the block as text
                stop = len(text) if end < 0 else end + len(CLOSE)
                normal.append(text[pos:stop])
                pos = stop
                continue
            normal.append(text[pos:start])
            calls.append(call)
            pos = len(text) if end < 0 else end + len(CLOSE)
        normal.append(text[pos:])
        return ParseResult("".join(normal), tuple(calls))

    def _block_call(self, body: str) -> ToolCall | None:
        """The call in a block's body: one JSON object and nothing but whitespace after it
        (a block cut short, e.g. by max_tokens, is no call)."""
        decoded = decode_json_prefix(body)
        if decoded is None or body[decoded[1]:].strip():
            return None
        return self.call_from_value(decoded[0])

    def render_calls(self, calls) -> str:
        return "\n".join(f"{OPEN}\n{self._dump(c)}\n{CLOSE}" for c in calls)

    def _dump(self, call: ToolCall) -> str:
        return json.dumps(self._call_dict(call), ensure_ascii=False)

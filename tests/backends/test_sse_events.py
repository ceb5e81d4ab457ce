"""The RuntimeEndpoint's SSE parser: one payload per event, multi-line data joined."""
from __future__ import annotations

from sgdsl.backends.runtime_endpoint import _sse_events


async def _lines(*lines: str):
    for line in lines:
        yield line


async def test_events_split_on_blank_lines():
    lines = _lines(": comment", "event: message", 'data: {"a":', 'data: 1}', "", "data: [DONE]", "")
    assert [e async for e in _sse_events(lines)] == ['{"a":\n1}', "[DONE]"]


async def test_trailing_event_without_blank_line():
    assert [e async for e in _sse_events(_lines("data:x", "id: 3"))] == ["x"]

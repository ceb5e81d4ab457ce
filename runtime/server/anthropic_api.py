"""Anthropic-compatible route: ``POST /v1/messages`` (plain and streaming), with tools
(``tool_use`` blocks, ``input_json_delta`` streaming) and, with a reasoning parser, ``thinking``
blocks. Every answer is one ``tool_turn`` (see there); this file only spells its events."""
from __future__ import annotations

import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .anthropic_protocol import MessagesRequest
from .context import ctx
from .errors import APIError
from .images import ImageCollector
from .json_body import json_response
from .sse import SSEResponse, guarded, prefetch, sse_event
from .tool_turn import (ArgsDelta, CallStart, ReasoningDelta, TextDelta, TurnEnd,
                        has_constraint, run_turn)
from .tools import render_prompt

router = APIRouter()


def stop_reason(end: TurnEnd, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished turn."""
    if end.reason == "length":
        return "max_tokens", None
    if end.reason == "tool_calls":
        return "tool_use", None
    if isinstance(end.matched, str) and end.matched in (stop_sequences or []):
        return "stop_sequence", end.matched
    return "end_turn", None


def _tool_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


@router.post("/v1/messages")
async def messages(req: MessagesRequest, request: Request) -> Response:
    c = ctx(request)
    c.check_model(req.model)
    plan = req.tool_plan(c.tool_format)
    reasoning = c.reasoning if req.wants_thinking else None
    images = ImageCollector.for_engine(c.engine)  # mm: image blocks
    chat = req.chat_messages(images)
    await images.resolve()  # mm: decoded off the loop (400 naming the block)
    if req.prefilled and chat[-1]["role"] == "assistant" and not chat[-1].get("tool_calls"):
        prompt = render_prompt(c.chat_template, chat[:-1], plan) + str(chat[-1]["content"])
    else:
        prompt = render_prompt(c.chat_template, chat, plan)
    sampling = c.sampling(req.sampling())
    if plan is not None and plan.active and has_constraint(sampling):
        raise APIError(400, "tools cannot be combined with another output constraint",
                       param="tools")
    events = run_turn(c, prompt, sampling, plan, reasoning, req.stream, request,
                      images.images)  # mm:
    head = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": req.model}
    if req.stream:
        return SSEResponse(guarded(await prefetch(_events(req, events, head)), "anthropic",
                                   trailer=None))
    end = None
    async for event in events:
        end = event if isinstance(event, TurnEnd) else end
    assert end is not None
    content: list[dict[str, Any]] = []
    if end.reasoning is not None:
        content.append({"type": "thinking", "thinking": end.reasoning, "signature": ""})
    if end.text or not end.calls:
        content.append({"type": "text", "text": end.text})
    content += [{"type": "tool_use", "id": _tool_id(), "name": call.name, "input": call.input}
                for call in end.calls]
    reason, sequence = stop_reason(end, req.stop_sequences)
    # NOTE: a tool's input is JSON the model wrote, parsed: it may hold an infinity
    return json_response({**head, "content": content, "stop_reason": reason,
                          "stop_sequence": sequence, "usage": {
                              "input_tokens": end.prompt_tokens,
                              "output_tokens": end.completion_tokens}},
                         may_hold_nonfinite=bool(end.calls))


class _Blocks:
    """The open content block while streaming: a new kind of event closes it and opens the
    next (thinking, then text, then tool_use blocks)."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        events = self.close()
        self.index, self.kind = self.index + 1, kind
        events.append(sse_event("content_block_start", {
            "type": "content_block_start", "index": self.index, "content_block": block}))
        return events

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [sse_event("content_block_stop", {"type": "content_block_stop",
                                                 "index": self.index})]

    def delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta",
                                                 "index": self.index, "delta": delta})


async def _events(req: MessagesRequest, events: AsyncIterator[Any],
                  head: dict[str, Any]) -> AsyncIterator[bytes]:
    blocks = _Blocks()
    started = False
    async for event in events:
        if not started:  # NOTE: input tokens are only known at the end; 0 until then
            started = True
            yield sse_event("message_start", {"type": "message_start", "message": {
                **head, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0}}})
        for out in _spell(blocks, event, req):
            yield out


def _spell(blocks: _Blocks, event: Any, req: MessagesRequest) -> list[bytes]:
    out: list[bytes] = []
    if isinstance(event, ReasoningDelta):
        if blocks.kind != "thinking":
            out += blocks.open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        out.append(blocks.delta({"type": "thinking_delta", "thinking": event.text}))
    elif isinstance(event, TextDelta):
        if blocks.kind != "text":
            out += blocks.open("text", {"type": "text", "text": ""})
        out.append(blocks.delta({"type": "text_delta", "text": event.text}))
    elif isinstance(event, CallStart):
        out += blocks.open("tool_use", {"type": "tool_use", "id": _tool_id(),
                                        "name": event.name, "input": {}})
    elif isinstance(event, ArgsDelta):
        out.append(blocks.delta({"type": "input_json_delta", "partial_json": event.text}))
    elif isinstance(event, TurnEnd):
        out += _closing(blocks, event, req)
    return out


def _closing(blocks: _Blocks, end: TurnEnd, req: MessagesRequest) -> list[bytes]:
    """Calls parsed from text (sent whole), an empty text block for an empty answer, the
    last block's stop, the message delta with the stop reason and usage, message stop."""
    out: list[bytes] = []
    if blocks.kind != "tool_use":
        for call in end.calls:
            out += blocks.open("tool_use", {"type": "tool_use", "id": _tool_id(),
                                            "name": call.name, "input": {}})
            out.append(blocks.delta({"type": "input_json_delta",
                                     "partial_json": call.arguments}))
    if blocks.index < 0:
        out += blocks.open("text", {"type": "text", "text": ""})
    out += blocks.close()
    reason, sequence = stop_reason(end, req.stop_sequences)
    out.append(sse_event("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
        "usage": {"input_tokens": end.prompt_tokens, "output_tokens": end.completion_tokens}}))
    out.append(sse_event("message_stop", {"type": "message_stop"}))
    return out

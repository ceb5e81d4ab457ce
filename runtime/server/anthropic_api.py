"""Anthropic-compatible route: ``POST /v1/messages`` (plain and streaming)."""
from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .anthropic_protocol import MessagesRequest
from .context import ServerContext, ctx
from .engine_client import GenBatch
from .sse import SSEResponse, guarded, prefetch, sse_event
from .tools import ToolPlan

router = APIRouter()


def stop_reason(meta: dict[str, Any], stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for an engine ``finish_reason``."""
    fr = meta.get("finish_reason") or {}
    if fr.get("type") == "length":
        return "max_tokens", None
    matched = fr.get("matched")
    if isinstance(matched, str) and matched in (stop_sequences or []):
        return "stop_sequence", matched
    return "end_turn", None


def _usage(meta: dict[str, Any]) -> dict[str, int]:
    return {"input_tokens": meta.get("prompt_tokens", 0),
            "output_tokens": meta.get("completion_tokens", 0)}


def _tool_block(plan: ToolPlan, text: str) -> dict[str, Any]:
    name, value = plan.parse(text)
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name,
            "input": value}


@router.post("/v1/messages")
async def messages(req: MessagesRequest, request: Request) -> Response:
    c = ctx(request)
    c.check_model(req.model)
    plan = req.tool_plan()
    chat = req.chat_messages()
    if req.prefilled:
        text = c.chat_template.render_continuation(chat)
    else:
        text = c.chat_template.render(chat)
    raw = req.sampling()
    if plan is not None:
        raw["json_schema"] = plan.json_schema
    batch = GenBatch.fan_out([c.encode_chat(text)], c.sampling(raw))
    head = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": req.model}
    if req.stream:
        events = await prefetch(_events(req, batch, head, c, plan))
        return SSEResponse(guarded(events, "anthropic", trailer=None))
    out = (await c.client.run(batch, request))[0]
    meta = out["meta_info"]
    reason, sequence = stop_reason(meta, req.stop_sequences)
    if plan is not None:
        content = [_tool_block(plan, out["text"])]
        reason = "tool_use" if reason == "end_turn" else reason
    else:
        content = [{"type": "text", "text": out["text"]}]
    return JSONResponse({**head, "content": content, "stop_reason": reason,
                         "stop_sequence": sequence, "usage": _usage(meta)})


async def _events(req: MessagesRequest, batch: GenBatch, head: dict[str, Any],
                  c: ServerContext, plan: ToolPlan | None) -> AsyncIterator[bytes]:
    sent = ""
    started = False
    async for _, chunk in c.client.stream(batch):
        meta = chunk["meta_info"]
        if not started:
            started = True
            start = {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                     "usage": {"input_tokens": meta.get("prompt_tokens", 0), "output_tokens": 0}}
            yield sse_event("message_start", {"type": "message_start", "message": start})
            if plan is None:
                yield sse_event("content_block_start", {
                    "type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}})
        new_text = chunk["text"][len(sent):]
        sent = chunk["text"]
        if plan is None and new_text:
            yield sse_event("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": new_text}})
        if meta.get("finish_reason") is not None:
            for event in _closing(req, meta, plan, sent):
                yield event


def _closing(req: MessagesRequest, meta: dict[str, Any], plan: ToolPlan | None,
             text: str) -> list[bytes]:
    """The events after the last token: (the tool call,) block stop, message delta, stop."""
    events = []
    reason, sequence = stop_reason(meta, req.stop_sequences)
    if plan is not None:
        block = _tool_block(plan, text)
        events.append(sse_event("content_block_start", {
            "type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}}))
        events.append(sse_event("content_block_delta", {
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
        reason = "tool_use" if reason == "end_turn" else reason
    events.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(sse_event("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
        "usage": {"output_tokens": meta.get("completion_tokens", 0)}}))
    events.append(sse_event("message_stop", {"type": "message_stop"}))
    return events

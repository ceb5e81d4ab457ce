"""Chat completions that go through ``tool_turn`` (tools offered, or a reasoning parser): the
turn's events as an OpenAI message, or as chunks with ``reasoning_content``, ``content`` and
``tool_calls`` deltas (name first, then the arguments piece by piece, as OpenAI streams them)."""
from __future__ import annotations

import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from .context import ServerContext
from .errors import APIError
from .json_body import json_response
from .openai_protocol import ChatCompletionRequest
from .reasoning import ReasoningFormat
from .sse import DONE, SSEResponse, guarded, prefetch, sse_data
from .tool_turn import (ArgsDelta, CallStart, ReasoningDelta, TextDelta, TurnEnd,
                        has_constraint, run_turn)
from .tools import ToolPlan


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _usage(end: TurnEnd) -> dict[str, Any]:
    return {"prompt_tokens": end.prompt_tokens, "completion_tokens": end.completion_tokens,
            "total_tokens": end.prompt_tokens + end.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": end.cached_tokens}}


def check_turn_request(req: ChatCompletionRequest, plan: ToolPlan | None,
                       sampling: dict[str, Any]) -> None:
    """What a tool/reasoning turn cannot do, refused up front naming the field."""
    if req.n != 1:
        raise APIError(400, "n must be 1 with tools or a reasoning parser", param="n")
    if req.logprobs:
        raise APIError(400, "logprobs are not supported with tools or a reasoning parser",
                       param="logprobs")
    if plan is not None and plan.active and has_constraint(sampling):
        raise APIError(400, "tools cannot be combined with another output constraint",
                       param="tools")


async def chat_turn(req: ChatCompletionRequest, c: ServerContext, request: Request,
                    prompt: str, sampling: dict[str, Any], plan: ToolPlan | None,
                    reasoning: ReasoningFormat | None, head: dict[str, Any],
                    images: list[Any] | None = None) -> Response:
    check_turn_request(req, plan, sampling)
    events = run_turn(c, prompt, sampling, plan, reasoning, req.stream, request, images)
    if req.stream:
        return SSEResponse(guarded(await prefetch(_chunks(req, events, head, reasoning)),
                                   "openai"))
    end = None
    async for event in events:
        end = event if isinstance(event, TurnEnd) else end
    assert end is not None
    message: dict[str, Any] = {"role": "assistant", "content": end.text or None}
    if end.calls:
        message["tool_calls"] = [{"id": _call_id(), "type": "function", "function": {
            "name": call.name, "arguments": call.arguments}} for call in end.calls]
    elif message["content"] is None:
        message["content"] = ""
    if reasoning is not None:
        message["reasoning_content"] = end.reasoning
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": end.reason}
    return json_response({**head, "object": "chat.completion", "choices": [choice],
                          "usage": _usage(end)})


async def _chunks(req: ChatCompletionRequest, events: AsyncIterator[Any], head: dict[str, Any],
                  reasoning: ReasoningFormat | None) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return sse_data({**head, "object": "chat.completion.chunk", "choices": [choice]})

    started: set[int] = set()
    first = True
    async for event in events:
        if first:  # NOTE: after the first event, so that a failed admission is still a 400
            first = False
            yield chunk({"role": "assistant", "content": ""})
        if isinstance(event, ReasoningDelta):
            yield chunk({"reasoning_content": event.text})
        elif isinstance(event, TextDelta):
            yield chunk({"content": event.text})
        elif isinstance(event, CallStart):
            started.add(event.index)
            yield chunk({"tool_calls": [{"index": event.index, "id": _call_id(),
                                         "type": "function",
                                         "function": {"name": event.name, "arguments": ""}}]})
        elif isinstance(event, ArgsDelta):
            yield chunk({"tool_calls": [{"index": event.index,
                                         "function": {"arguments": event.text}}]})
        elif isinstance(event, TurnEnd):
            for i, call in enumerate(event.calls):  # calls parsed from text: sent whole
                if i not in started:
                    yield chunk({"tool_calls": [{"index": i, "id": _call_id(), "type": "function",
                                                 "function": {"name": call.name,
                                                              "arguments": call.arguments}}]})
            yield chunk({}, event.reason)
            if req.include_usage:
                yield sse_data({**head, "object": "chat.completion.chunk", "choices": [],
                                "usage": _usage(event)})
    yield DONE

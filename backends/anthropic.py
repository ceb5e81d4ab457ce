"""``Anthropic``: programs run on the Messages API through the official ``anthropic`` client
(``AsyncAnthropic``). System text goes in ``system``; images as base64 blocks; a partly
written assistant turn is sent as the assistant prefill. ``json_schema`` and ``select`` are
enforced with a forced tool whose input schema is the constraint (an enum for ``select``)."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Sequence

from sgdsl.ir import Constraint, SamplingParams

from ._common import (as_schema, b64, backend_error, chat_messages, choice_schema,
                      finish_reason, merge_turns, parse_choice, split_extensions)
from .base import Backend, Capabilities, Context, GenResult, SelectResult, StreamChunk, UnsupportedError
from .loop_local import LoopLocal
from .tool_calls import anthropic_calls, anthropic_tools

_NATIVE = ("temperature", "top_p", "top_k", "stop", "max_tokens")
_TOOL = "answer"
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "stop",
                 "max_tokens": "length", "refusal": "stop", "pause_turn": "stop"}


class Anthropic(Backend):
    """``Anthropic("claude-3-5-haiku-latest")``; ``base_url``/``api_key`` default to the
    client's ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``. ``extensions=True`` sends
    min_tokens, seed... in ``extra_body`` for servers that accept them."""

    name = "Anthropic"
    capabilities = Capabilities(chat_only=True, constraints=frozenset({"json_schema", "tools"}),
                                images=True, partial_assistant=True)

    def __init__(self, model_name: str, *, base_url: str | None = None,
                 api_key: str | None = None, extensions: bool | None = None,
                 **client_options: Any) -> None:
        import os

        import anthropic  # the official client; imported only when a backend is built

        self._anthropic = anthropic
        self.model_name = model_name
        base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL")
        api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or ("EMPTY" if base_url else None)
        # NOTE: off by default even for self-hosted servers: Messages-API servers (ours
        # included) reject unknown fields, unlike OpenAI-compatible ones.
        self.extensions = bool(extensions)
        self._clients = LoopLocal(lambda: anthropic.AsyncAnthropic(
            base_url=base_url, api_key=api_key, **client_options))

    def get_model_name(self) -> str:
        return self.model_name

    # ---- requests ---------------------------------------------------------------------------

    def _request(self, ctx: Context, params: SamplingParams,
                 constraint: Constraint | None) -> dict[str, Any]:
        if params.stop_regex:
            raise UnsupportedError("Anthropic API has no stop_regex")
        if params.return_logprob:
            raise UnsupportedError("Anthropic API returns no logprobs")
        extra = split_extensions(params, _NATIVE, self.name, self.extensions)
        system, messages = self._messages(ctx)
        req: dict[str, Any] = {"model": self.model_name, "messages": messages,
                               "max_tokens": params.resolved("max_tokens")}
        if system:
            req["system"] = system
        # NOTE: temperature/top_p/top_k are Messages API fields that recent official clients
        # no longer take as arguments; they travel in extra_body (same JSON on the wire).
        for key in ("temperature", "top_p"):
            if getattr(params, key) is not None:
                extra[key] = getattr(params, key)
        if params.top_k is not None and params.top_k > 0:
            extra["top_k"] = params.top_k
        if params.stop:
            req["stop_sequences"] = list(params.stop)
        if extra:
            req["extra_body"] = extra
        if constraint is not None and constraint.kind == "tools":
            req.update(anthropic_tools(constraint.value))
        elif constraint is not None:
            if constraint.kind != "json_schema":
                raise UnsupportedError(f"Anthropic cannot enforce {constraint.kind!r} natively; "
                                       "validate-and-retry applies")
            schema = as_schema(constraint.value)
            req["tools"] = [{"name": _TOOL, "description": "Give the answer through this tool.",
                             "input_schema": _object_schema(schema)}]
            req["tool_choice"] = {"type": "tool", "name": _TOOL}
        return req

    def _messages(self, ctx: Context) -> tuple[str, list[dict[str, Any]]]:
        messages = chat_messages(ctx)
        system = "\n".join(m.content for m in messages if m.role == "system")
        turns = merge_turns(m for m in messages if m.role != "system")
        if turns and turns[-1].role == "assistant":
            last = turns[-1]
            prefill = last.content.rstrip()  # the API rejects a prefill ending in whitespace
            turns = turns[:-1] + ([type(last)(role="assistant", content=prefill)] if prefill else [])
        out = []
        for m in turns:
            if m.images:
                blocks: list[dict[str, Any]] = [
                    {"type": "image", "source": {"type": "base64", "media_type": i.mime_type,
                                                 "data": b64(i)}} for i in m.images]
                if m.content:
                    blocks.append({"type": "text", "text": m.content})
                out.append({"role": m.role, "content": blocks})
            else:
                out.append({"role": m.role, "content": m.content})
        return system, out

    async def _create(self, req: dict[str, Any]) -> Any:
        try:
            return await self._clients.get().messages.create(**req)
        except self._anthropic.APIError as exc:
            raise backend_error(self.name, exc) from exc

    # ---- Backend API ------------------------------------------------------------------------

    async def generate(self, ctx: Context, params: SamplingParams,
                       constraint: Constraint | None = None) -> list[GenResult]:
        req = self._request(ctx, params, constraint)
        # NOTE: no native n; the requests run concurrently and are accounted separately.
        resps = await asyncio.gather(*(self._create(dict(req)) for _ in range(params.n or 1)))
        if constraint is not None and constraint.kind == "tools":
            return [GenResult(text="".join(b.text for b in r.content if b.type == "text"),
                              meta_info=_meta(r) | {"tool_calls": anthropic_calls(r)})
                    for r in resps]
        wrapped = constraint is not None and _needs_wrap(as_schema(constraint.value))
        return [GenResult(text=_text_of(r, wrapped), meta_info=_meta(r)) for r in resps]

    async def stream(self, ctx: Context, params: SamplingParams,
                     constraint: Constraint | None = None) -> AsyncIterator[StreamChunk]:
        if (params.n or 1) > 1:
            raise UnsupportedError("Anthropic backend streams one completion at a time (n=1)")
        if constraint is not None and _needs_wrap(as_schema(constraint.value)):
            raise UnsupportedError("Anthropic streams JSON only for object schemas")
        req = self._request(ctx, params, constraint)
        stream = await self._create({**req, "stream": True})
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
        reason: Any = None
        try:
            async for event in stream:
                if event.type == "message_start":
                    usage.update(_usage(event.message.usage))
                elif event.type == "content_block_delta":
                    delta = getattr(event.delta, "text", None) or getattr(event.delta, "partial_json", None)
                    if delta:
                        yield StreamChunk(text=delta)
                elif event.type == "message_delta":
                    reason = event.delta.stop_reason
                    usage["completion_tokens"] = event.usage.output_tokens or 0
        except self._anthropic.APIError as exc:
            raise backend_error(self.name, exc) from exc
        finally:  # on cancel or early close this drops the HTTP response: the server aborts
            await stream.close()
        yield StreamChunk(text="", done=True,
                          meta_info={**usage, "finish_reason": finish_reason(_STOP_REASONS.get(reason, reason))})

    async def select(self, ctx: Context, choices: Sequence[str], temperature: float,
                     choices_method: Any) -> SelectResult:
        params = SamplingParams(max_tokens=32 + max(len(c) for c in choices) * 2,
                                temperature=temperature)
        constraint = Constraint(kind="json_schema", value=choice_schema(choices))
        result = (await self.generate(ctx, params, constraint))[0]
        return SelectResult(index=parse_choice(result.text, list(choices), self.name),
                            meta_info=dict(result.meta_info))

    async def close(self) -> None:
        await self._clients.aclose_current()


def _needs_wrap(schema: dict) -> bool:
    return schema.get("type") != "object"


def _object_schema(schema: dict) -> dict:
    """Tool inputs are objects: wrap any other schema as the ``value`` field."""
    if not _needs_wrap(schema):
        return schema
    return {"type": "object", "properties": {"value": schema}, "required": ["value"]}


def _text_of(resp: Any, wrapped: bool) -> str:
    for block in resp.content:
        if block.type == "tool_use":
            value = block.input["value"] if wrapped else block.input
            return json.dumps(value, ensure_ascii=False)
    return "".join(b.text for b in resp.content if b.type == "text")


def _usage(usage: Any) -> dict[str, int]:
    return {"prompt_tokens": getattr(usage, "input_tokens", 0) or 0,
            "completion_tokens": getattr(usage, "output_tokens", 0) or 0,
            "cached_tokens": getattr(usage, "cache_read_input_tokens", 0) or 0}


def _meta(resp: Any) -> dict[str, Any]:
    reason = _STOP_REASONS.get(resp.stop_reason, resp.stop_reason)
    matched = resp.stop_sequence if resp.stop_reason == "stop_sequence" else None
    return {**_usage(resp.usage), "id": resp.id, "model": resp.model,
            "finish_reason": finish_reason(reason, matched)}

"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``."""
from __future__ import annotations

import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .context import ServerContext, ctx
from .engine_client import GenBatch, new_rid
from .images import ImageCollector
from .json_body import json_response
from .openai_format import (LogprobCursor, chat_logprobs, completion_logprobs, finish_reason,
                            usage)
from .openai_protocol import ChatCompletionRequest, CompletionRequest
from .sse import DONE, SSEResponse, guarded, prefetch, sse_data
from .openai_turn import chat_turn
from .prompt_ids import encoded_off_loop
from .tools import render_prompt

router = APIRouter()


def _model_card(c: ServerContext) -> dict[str, Any]:
    return {"id": c.model_name, "object": "model", "created": c.created, "owned_by": "sgdsl",
            "root": c.model_path, "max_model_len": c.context_length}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(ctx(request))]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    c = ctx(request)
    c.check_model(model_id)
    return _model_card(c)


# ---------------------------------------------------------------- completions

@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request) -> Response:
    c = ctx(request)
    c.check_model(req.model)
    req.check_unsupported()
    prompts = req.prompts()
    sampling = c.sampling(req.sampling(req.max_tokens if req.max_tokens is not None else 16))
    want_lp = req.logprobs is not None
    batch = GenBatch.fan_out(prompts, sampling, n=req.n, return_logprob=want_lp,
                             top_logprobs_num=req.logprobs or 0,
                             logprob_start_len=0 if (want_lp and req.echo) else -1)
    batch = await encoded_off_loop(c, batch)
    echoes = [_echo_text(c, p) if req.echo else "" for p in prompts]
    head = {"id": f"cmpl-{new_rid()}", "created": int(time.time()), "model": c.model_name}
    if req.stream:
        events = await prefetch(_completion_events(req, batch, echoes, head, c))
        return SSEResponse(guarded(events, "openai"))
    outputs = await c.client.run(batch, request)
    choices = [_completion_choice(req, i, out, echoes[i // req.n])
               for i, out in enumerate(outputs)]
    return json_response({**head, "object": "text_completion", "choices": choices,
                          "usage": usage(outputs, req.n)}, may_hold_nonfinite=want_lp)


def _echo_text(c: ServerContext, prompt: str | list[int]) -> str:
    return prompt if isinstance(prompt, str) else c.engine.tokenizer.decode(prompt)


def _completion_choice(req: CompletionRequest, index: int, out: dict[str, Any],
                       echo: str) -> dict[str, Any]:
    meta = out["meta_info"]
    logprobs = None
    if req.logprobs is not None:
        entries = list(meta.get("output_token_logprobs") or [])
        tops = meta.get("output_top_logprobs")
        if req.echo:
            entries = list(meta.get("input_token_logprobs") or []) + entries
            tops = None if tops is None else list(meta.get("input_top_logprobs") or []) + list(tops)
        logprobs = completion_logprobs(entries, tops if req.logprobs else None)
    return {"index": index, "text": echo + out["text"], "logprobs": logprobs,
            "finish_reason": finish_reason(meta)}


async def _completion_events(req: CompletionRequest, batch: GenBatch, echoes: list[str],
                             head: dict[str, Any], c: ServerContext) -> AsyncIterator[bytes]:
    texts = [""] * len(batch.items)
    started = [False] * len(batch.items)
    finals: dict[int, dict[str, Any]] = {}
    cursor = LogprobCursor(len(batch.items))
    async for i, chunk in c.client.stream(batch):
        meta = chunk["meta_info"]
        delta = chunk["text"][len(texts[i]):]
        texts[i] = chunk["text"]
        if not started[i]:
            delta, started[i] = echoes[i // req.n] + delta, True
        reason = finish_reason(meta)
        if not delta and reason is None:
            cursor.feed(i, meta)  # nothing to send: its logprob entries go with the next
            continue
        logprobs = None
        if req.logprobs is not None:
            entries, tops = cursor.take(i, meta)
            logprobs = completion_logprobs(entries, tops if req.logprobs else None,
                                           offset=len(texts[i]) - len(delta))
        if reason is not None:
            finals[i] = chunk
        choice = {"index": i, "text": delta, "logprobs": logprobs, "finish_reason": reason}
        yield sse_data({**head, "object": "text_completion", "choices": [choice]})
    if req.include_usage:
        outs = [finals[i] for i in sorted(finals)]
        yield sse_data({**head, "object": "text_completion", "choices": [],
                        "usage": usage(outs, req.n)})
    yield DONE


# ---------------------------------------------------------------- chat completions

@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
    c = ctx(request)
    c.check_model(req.model)
    plan = req.tool_plan(c.tool_format)
    reasoning = c.reasoning if req.separate_reasoning else None
    images = ImageCollector.for_engine(c.engine)  # mm: image_url parts
    text = render_prompt(c.chat_template, [m.as_template_message(images, f"messages[{i}]")
                                           for i, m in enumerate(req.messages)], plan)
    await images.resolve()  # mm: decoded off the loop (400 naming the part)
    ids = await c.encode_chat_async(text)
    limit = req.token_limit()
    if limit is None:  # OpenAI's default: whatever room the context leaves
        limit = max(c.context_length - len(ids), 1) if c.context_length else 256
    raw = req.sampling(limit)
    head = {"id": f"chatcmpl-{new_rid()}", "created": int(time.time()),
            "model": c.model_name}
    if (plan is not None and plan.active) or reasoning is not None:
        return await chat_turn(req, c, request, text, c.sampling(raw), plan, reasoning, head,
                               images.images)  # mm:
    batch = GenBatch.fan_out([ids], c.sampling(raw), n=req.n, return_logprob=req.logprobs,
                             top_logprobs_num=req.top_logprobs or 0,
                             image_data=[images.images])
    if req.stream:
        events = await prefetch(_chat_events(req, batch, head, c))
        return SSEResponse(guarded(events, "openai"))
    outputs = await c.client.run(batch, request)
    choices = [_chat_choice(req, i, out) for i, out in enumerate(outputs)]
    return json_response({**head, "object": "chat.completion", "choices": choices,
                          "usage": usage(outputs, req.n)}, may_hold_nonfinite=req.logprobs)


def _chat_choice(req: ChatCompletionRequest, index: int, out: dict[str, Any]) -> dict[str, Any]:
    meta = out["meta_info"]
    message: dict[str, Any] = {"role": "assistant", "content": out["text"]}
    logprobs = None
    if req.logprobs:
        logprobs = chat_logprobs(meta.get("output_token_logprobs") or [],
                                 meta.get("output_top_logprobs"))
    return {"index": index, "message": message, "logprobs": logprobs,
            "finish_reason": finish_reason(meta)}


async def _chat_events(req: ChatCompletionRequest, batch: GenBatch, head: dict[str, Any],
                       c: ServerContext) -> AsyncIterator[bytes]:
    k = len(batch.items)
    texts, started = [""] * k, [False] * k
    finals: dict[int, dict[str, Any]] = {}
    cursor = LogprobCursor(k)
    async for i, chunk in c.client.stream(batch):
        meta = chunk["meta_info"]
        new_text = chunk["text"][len(texts[i]):]
        texts[i] = chunk["text"]
        delta: dict[str, Any] = {}
        if not started[i]:
            delta, started[i] = {"role": "assistant", "content": ""}, True
        reason = finish_reason(meta)
        if new_text:
            delta["content"] = new_text
        if not delta and reason is None:
            cursor.feed(i, meta)  # nothing to send: its logprob entries go with the next
            continue
        logprobs = None
        if req.logprobs:
            logprobs = chat_logprobs(*cursor.take(i, meta))
        if reason is not None:
            finals[i] = chunk
        choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        yield sse_data({**head, "object": "chat.completion.chunk", "choices": [choice]})
    if req.include_usage:
        outs = [finals[i] for i in sorted(finals)]
        yield sse_data({**head, "object": "chat.completion.chunk", "choices": [],
                        "usage": usage(outs, req.n)})
    yield DONE

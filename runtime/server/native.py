"""SGLang-native routes: ``/generate`` and the small admin/info endpoints, shaped so that
SGLang's own ``RuntimeEndpoint`` client can drive this server unchanged."""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from .context import ServerContext, ctx
from .engine_client import GenBatch, new_rid
from .errors import APIError
from .images import ImageCollector
from .json_body import json_response
from .prompt_ids import encoded_off_loop
from .native_protocol import (AbortRequest, ConcatAppendRequest, GenerateRequest,
                              PrecompileRequest)
from .sse import DONE, SSEResponse, guarded, prefetch, sse_data

router = APIRouter()


def _prompts(req: GenerateRequest) -> tuple[list[str | list[int]], bool]:
    """The prompts and whether the request was a batch (list answer)."""
    if (req.text is None) == (req.input_ids is None):
        raise APIError(400, "exactly one of 'text' or 'input_ids' must be given", param="text")
    req.check_refused()
    if req.text is not None:
        return ([req.text], False) if isinstance(req.text, str) else (list(req.text), True)
    ids = req.input_ids
    if ids and isinstance(ids[0], list):
        return [list(x) for x in ids], True
    return [list(ids)], False


def _uniform(value: Any, name: str) -> Any:
    """Per-prompt logprob options must agree (one engine-wide setting per request)."""
    if not isinstance(value, list):
        return value
    value = [v for v in value if v is not None] or [None]
    if not value or any(v != value[0] for v in value):
        raise APIError(400, f"per-prompt values of {name} must all be equal", param=name)
    return value[0]


def build_batch(c: ServerContext, req: GenerateRequest) -> tuple[GenBatch, bool]:
    prompts, is_batch = _prompts(req)
    if not prompts:
        raise APIError(400, "no prompt given", param="text")
    raw = req.sampling_params if req.sampling_params is not None else {}
    per_prompt = raw if isinstance(raw, list) else [raw] * len(prompts)
    if len(per_prompt) != len(prompts):
        raise APIError(400, "sampling_params list must match the number of prompts",
                       param="sampling_params")
    sampling = [c.sampling(dict(sp)) for sp in per_prompt]
    n = sampling[0].get("n", 1)
    if any(sp.get("n", 1) != n for sp in sampling):
        raise APIError(400, "n must be the same for every prompt", param="n")
    sampling = [{k: v for k, v in sp.items() if k != "n"} for sp in sampling]
    rids = _rids(req.rid, len(prompts), n)
    images = ImageCollector.for_engine(c.engine).native(req.image_data, len(prompts))  # mm:
    batch = GenBatch.fan_out(
        prompts, sampling, n=n, rids=rids, image_data=images,
        return_logprob=bool(_uniform(req.return_logprob, "return_logprob")),
        logprob_start_len=_default(_uniform(req.logprob_start_len, "logprob_start_len"), -1),
        top_logprobs_num=_default(_uniform(req.top_logprobs_num, "top_logprobs_num"), 0),
        return_text_in_logprobs=req.return_text_in_logprobs)
    return batch, is_batch or n > 1


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _rids(rid: str | list[str] | None, num_prompts: int, n: int) -> list[str]:
    if rid is None:
        return [new_rid() for _ in range(num_prompts * n)]
    base = [rid] if isinstance(rid, str) else list(rid)
    if len(base) != num_prompts:
        raise APIError(400, "rid list must match the number of prompts", param="rid")
    return [r if n == 1 else f"{r}-{i}" for r in base for i in range(n)]


@router.post("/generate")
async def generate(req: GenerateRequest, request: Request) -> Response:
    c = ctx(request)
    batch, is_batch = build_batch(c, req)
    batch = await encoded_off_loop(c, batch)
    if req.stream:
        events = await prefetch(_stream_events(c, batch, is_batch))
        return SSEResponse(guarded(events, "native"))
    # a list answer reports a failed request in its own output, as SGLang does
    outputs = await c.client.run(batch, request, per_request_errors=is_batch)
    return json_response(outputs if is_batch else outputs[0],
                         may_hold_nonfinite=batch.return_logprob)


async def _stream_events(c: ServerContext, batch: GenBatch, is_batch: bool
                         ) -> AsyncIterator[bytes]:
    async for index, chunk in c.client.stream(batch):
        out = dict(chunk)
        if is_batch:
            out["index"] = index
        stamps = out["meta_info"].get("hop_times")
        if stamps is not None:  # hops: + when this loop wrote it ($SGDSL_HOP_TIMES)
            stamps.append(time.time())
        yield sse_data(out, may_hold_nonfinite=batch.return_logprob)
    yield DONE


async def _model_info(request: Request) -> dict[str, Any]:
    c = ctx(request)
    info = dict(c.engine.model_info)
    info.setdefault("tokenizer_path", info.get("model_path"))
    info.setdefault("served_model_name", c.model_name)
    return jsonable_encoder(info)


async def _server_info(request: Request) -> dict[str, Any]:
    c = ctx(request)
    info = await asyncio.to_thread(c.engine.server_info)
    # NOTE: the api key is never echoed back; only whether one is required.
    info = dict(info, host=c.args.host, port=c.args.port, api_key_required=bool(c.args.api_key))
    return jsonable_encoder(info)


for _path in ("/get_model_info", "/model_info"):
    router.add_api_route(_path, _model_info, methods=["GET"])
for _path in ("/get_server_info", "/server_info"):
    router.add_api_route(_path, _server_info, methods=["GET"])


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while the engine answers; an engine that died answers 503 (via its error)."""
    await asyncio.to_thread(ctx(request).engine.stats)
    return PlainTextResponse("OK")


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """Runs one real one-token generation end to end."""
    c = ctx(request)
    batch = GenBatch.fan_out([[0]], {"max_new_tokens": 1, "temperature": 0.0})
    await c.client.run(batch, request)
    return PlainTextResponse("OK")


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    ok = await asyncio.to_thread(ctx(request).engine.flush_cache)
    if not ok:
        raise APIError(400, "Cache not flushed: requests are running")
    return PlainTextResponse("Cache flushed.")


@router.post("/concate_and_append_request")
async def concate_and_append_request(req: ConcatAppendRequest) -> Response:
    """SGLang's client calls this when a ``fork`` is joined with ``concate_and_append``: a hint
    to splice the forks' KV after the parent's. Its next ``/generate`` carries the joined text
    in full, so nothing is spliced here: the radix cache gives back the shared prefix and the
    forks' text is prefilled at its real positions (a spliced KV would keep each fork's own
    positions, an approximation SGLang's interpreter accepted). SGLang's current server has
    no such route; its client fails against it without this one."""
    return JSONResponse({"success": True, "src_rids": len(req.src_rids)})


@router.post("/abort_request")
async def abort_request(req: AbortRequest, request: Request) -> Response:
    c = ctx(request)
    if req.abort_all:
        c.client.abort(sorted(c.client.live))
        return PlainTextResponse("OK")
    if not req.rid:
        raise APIError(400, "rid (or abort_all) is required", param="rid")
    await asyncio.to_thread(c.engine.abort, req.rid)
    return PlainTextResponse("OK")


@router.post("/precompile")
async def precompile(req: PrecompileRequest, request: Request) -> Response:
    """Compile grammar constraints ahead of requests (``Engine.precompile``): answers once
    each is decided, ``{"results": [{"ok": true, "kind": ...} or {"ok": false, "kind",
    "error", "field", "status"}, ...]}`` in order (a failed constraint is a result, not an
    HTTP error)."""
    results = await asyncio.to_thread(ctx(request).engine.precompile, req.constraints)
    return JSONResponse({"results": results})


@router.get("/debug/check_idle_integrity")
async def check_idle_integrity(request: Request) -> Response:
    """Asserts the scheduler's idle invariant (free + evictable == total KV slots, no locked
    prefix without a running request); 409 with the reason if it does not hold."""
    try:
        await asyncio.to_thread(ctx(request).engine.check_idle_integrity)
    except AssertionError as exc:
        raise APIError(409, f"idle integrity check failed: {exc}") from exc
    return JSONResponse({"ok": True})

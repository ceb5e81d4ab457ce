"""``GET /load``: how much work this server has queued, for a router that balances by work.

One scheduler stats RPC per call (the scheduler answers between two steps; O(queue) sums, no
tree walks), so a router can poll it every few tens of milliseconds. The shape:

    {"num_waiting_reqs", "num_running_reqs",      # requests queued / in the running batch
     "queued_prefill_tokens",                      # prompt tokens still to prefill (uncached)
     "remaining_decode_tokens",                    # output tokens still to decode (max_new_tokens)
     "running_kv_tokens",                          # KV held by the running batch
     "kv_total_slots", "kv_free_slots", "kv_evictable_slots", "kv_usage",
     "prompt_tokens_total"}                         # prompt tokens admitted so far (a counter)
"""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from .context import ctx

router = APIRouter()

_KEYS = ("num_waiting_reqs", "num_running_reqs", "queued_prefill_tokens",
         "remaining_decode_tokens", "running_kv_tokens", "kv_total_slots", "kv_free_slots",
         "kv_evictable_slots", "prompt_tokens_total")


@router.get("/load")
async def load(request: Request) -> JSONResponse:
    stats = await asyncio.to_thread(ctx(request).engine.stats)  # a blocking IPC call
    body = {k: stats[k] for k in _KEYS if k in stats}
    total = stats.get("kv_total_slots") or 0
    # Slots held by requests (not free, not merely cached and evictable).
    used = total - stats.get("kv_free_slots", 0) - stats.get("kv_evictable_slots", 0)
    body["kv_usage"] = used / total if total else 0.0
    return JSONResponse(body)

"""The streaming client of ``bench_pd.py``: timed arrivals, each a streamed native
``/generate``, with every chunk's arrival time (and, with ``$SGDSL_HOP_TIMES`` on the servers,
its hop times: see runtime/hop_times.py).

One process can pace the measurement itself: each chunk costs the client an HTTP read, a line
split and a JSON parse, and every stream's chunk of a decode step arrives at once. So the
arrivals can be dealt round-robin to ``procs`` client processes (``run_split``), each running
its share on its own loop against the same wall-clock start; a gap a single client adds then
disappears with more clients, a gap the servers add does not. No torch here (client processes
import only this and httpx).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import multiprocessing
import time
from typing import Any

import httpx

try:  # NOTE: several times faster than json on these chunks; json is the fallback
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the installation
    import json

    _loads = json.loads

Arrival = tuple[float, list[int], int]  # (second after the start, prompt ids, output tokens)
ROUTER_PREFIX = ": router "


async def one(client: httpx.AsyncClient, at: float, ids: list[int], n_out: int,
              t0: float) -> dict[str, Any]:
    """One streamed request sent at wall-clock ``t0 + at``: its TTFT, gaps and chunk events
    (client time, completion tokens so far, hop times or None, router time or None, hop
    steps or None)."""
    await asyncio.sleep(max(0.0, t0 + at - time.time()))
    body = {"input_ids": ids, "stream": True, "sampling_params": {
        "max_new_tokens": n_out, "temperature": 0, "ignore_eos": True}}
    sent, events, tokens = time.time(), [], 0
    async with client.stream("POST", "/generate", json=body) as r:
        if r.status_code != 200:
            return {"error": f"{r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if line.startswith(ROUTER_PREFIX):  # hops: the router's time for what came before
                _router_time(events, float(line[len(ROUTER_PREFIX):]))
                continue
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            now = time.time()
            chunk = _loads(line[5:])
            if "error" in chunk:
                return {"error": str(chunk["error"])[:200]}
            meta = chunk.get("meta_info", {})
            tokens = meta.get("completion_tokens", tokens)
            events.append([now, tokens, meta.get("hop_times"), None, meta.get("hop_steps")])
    if not events:
        return {"error": "no chunk"}
    stamps = [e[0] for e in events]
    return {"ttft": stamps[0] - sent, "itl": [b - a for a, b in zip(stamps, stamps[1:])],
            "tok_itl": token_itl(events), "prompt": len(ids), "output": tokens,
            "events": events if events[0][2] is not None else None}


def token_itl(events: list[list]) -> list[float]:
    """Inter-token latencies as SGLang's bench_serving counts them on a native stream: a chunk
    of k new tokens gives k gaps of (its time - the previous chunk's) / k; a chunk without new
    tokens counts nothing. (A server that holds a token's text back, an incomplete UTF-8
    character, sends its chunk with the next one: one gap per chunk would count the wait once,
    as long as several steps.)"""
    out: list[float] = []
    for (t_a, n_a, *_), (t_b, n_b, *_) in zip(events, events[1:]):
        if n_b > n_a:
            out.extend([(t_b - t_a) / (n_b - n_a)] * (n_b - n_a))
    return out


def _router_time(events: list[list], t: float) -> None:
    for event in reversed(events):
        if event[3] is not None:
            break
        event[3] = t


async def run_share(url: str, arrivals: list[Arrival], t0: float) -> list[dict[str, Any]]:
    """Every arrival of this share against ``url``, timed from wall-clock ``t0``."""
    gc.collect()
    gc.freeze()  # the imports and the workload: no full collection walks them mid-run
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=1024)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        return list(await asyncio.gather(*(one(client, at, ids, n, t0)
                                           for at, ids, n in arrivals)))


def _share_main(url: str, arrivals: list[Arrival], t0: float) -> tuple[list[dict], float]:
    cpu = time.process_time()
    results = asyncio.run(run_share(url, arrivals, t0))
    return results, time.process_time() - cpu


def _ready(_: int) -> bool:
    time.sleep(0.5)  # each call holds a worker: the pool starts all of them before the run
    return True


def run_split(url: str, arrivals: list[Arrival], procs: int) -> tuple[list[dict], float, float]:
    """``arrivals`` dealt round-robin to ``procs`` processes (1: this one): the results in
    arrival order, the wall time from the start to the last answer, and the clients' CPU s."""
    if procs <= 1:
        t0, cpu = time.time(), time.process_time()
        results = asyncio.run(run_share(url, arrivals, t0))
        return results, time.time() - t0, time.process_time() - cpu
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        list(pool.map(_ready, range(procs)))  # started and imported: not timed
        t0 = time.time() + 0.2
        futures = [pool.submit(_share_main, url, arrivals[k::procs], t0) for k in range(procs)]
        shares = [f.result() for f in futures]
        wall = time.time() - t0
    results: list[dict] = [{}] * len(arrivals)
    for k, (share, _) in enumerate(shares):
        results[k::procs] = share
    return results, wall, sum(cpu for _, cpu in shares)

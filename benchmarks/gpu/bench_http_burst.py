"""A burst of concurrent HTTP requests against ``sgdsl serve``: what the server pays per request
and how the burst reaches the scheduler (issue 29: the HTTP paths' gap to one batched call).

For each route, ``--requests`` requests posted at once by aiohttp (the cheap client, so the
server's side shows), after a flush of the cache:

- ``native``: separate ``/generate`` posts of token ids; ``list``: the same prompts as one list
  ``/generate`` (one HTTP request, one Engine call: the reference a burst should approach);
  ``native-json`` / ``list-json``: the same with the person schema (``json_schema``);
- ``chat`` / ``chat-json``: separate ``/v1/chat/completions`` posts of the user text
  (``chat-json`` with ``response_format`` json_schema, the person schema).

Per route: wall, the server process's and the scheduler's CPU seconds, and from the scheduler's
counters the number of prefill waves (``extend_steps``) and forwards. ``lone`` rows: one request
at a time (max_new_tokens 1), median latency: what a lone request pays (a coalescing window must
not add to it). Variants: this tree's server as is (``coalesced``) and with
``--disable-request-coalescing`` (``per-call``: one scheduler message per request, as before
runtime/submitter.py); ``--python NAME=PATH`` adds a server run by another interpreter (another
tree's venv); ``--together`` runs them side by side with rounds interleaved (same load on a
shared CPU box).

    python benchmarks/gpu/bench_http_burst.py --device cpu --tiny --max-new 8 --together
    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/bench_http_burst.py \\
        --model-config benchmarks/gpu/configs/llama-3.1-8b --load-format dummy
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_structured_paths as bsp  # noqa: E402
import structured_paths as sp  # noqa: E402
from common import device_line  # noqa: E402
from proc_stats import cpu_seconds, descendants  # noqa: E402  (benchmarks/, put on the path by structured_paths)

ROUTES = ("native", "list", "chat", "native-json", "list-json", "chat-json")
VARIANTS = {"coalesced": [], "per-call": ["--disable-request-coalescing"]}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default=str(bsp.CONFIGS / "llama-3.1-8b"))
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lone", type=int, default=7, help="lone requests per route (median)")
    ap.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS),
                    help="servers of this tree: coalesced (default) and per-call "
                         "(--disable-request-coalescing: one scheduler message per request)")
    ap.add_argument("--python", action="append", default=[], metavar="NAME=PATH",
                    help="a server run by another interpreter (another tree's venv)")
    ap.add_argument("--together", action="store_true",
                    help="run the servers side by side, rounds interleaved (CPU: same load); "
                         "default one at a time (a GPU holds one model's KV pool at a time)")
    a = ap.parse_args()
    a.batches, a.grammar_backend, a.chat_matched = [a.requests], "xgrammar", True
    a.disable_jump_forward, a.jump_max_batch, a.disable_request_coalescing = False, None, False
    return a


def bodies(route: str, texts: list[str], ids: list[list[int]], users: list[str],
           max_new: int) -> tuple[str, list[dict[str, Any]]]:
    """The route's path and its request bodies (one for ``list``)."""
    free = {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True}
    if route.endswith("-json"):
        free = {"max_new_tokens": max_new, "temperature": 0.0, "json_schema": sp.SCHEMA_TEXT}
    if route.startswith("native"):
        return "/generate", [{"input_ids": x, "sampling_params": free} for x in ids]
    if route.startswith("list"):
        return "/generate", [{"input_ids": ids, "sampling_params": [free] * len(ids)}]
    extra: dict[str, Any] = {"ignore_eos": True}
    if route == "chat-json":
        extra = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "person", "schema": sp.SCHEMA}}}
    return "/v1/chat/completions", [
        {"model": "default", "messages": [{"role": "user", "content": u}],
         "max_tokens": max_new, "temperature": 0.0, **extra} for u in users]


async def post_all(url: str, path: str, payloads: list[dict[str, Any]]) -> list[Any]:
    import aiohttp

    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(body: dict[str, Any]) -> Any:
            async with session.post(path, json=body) as resp:
                out = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"{path}: {resp.status} {out}")
                return out
        return await asyncio.gather(*(one(b) for b in payloads))


def counters(url: str) -> dict[str, int]:
    info = httpx.get(url + "/get_server_info", timeout=60).json()
    return {k: int(info.get(k, 0)) for k in ("extend_steps", "forward_steps", "submit_handoffs")}


def burst(server: sp.Server, path: str, payloads: list[dict[str, Any]]) -> dict[str, float]:
    server.flush()
    kids = descendants(server.proc.pid)
    c0, s0, k0 = counters(server.url), cpu_seconds(server.proc.pid), sum(map(cpu_seconds, kids))
    t0 = time.perf_counter()
    asyncio.run(post_all(server.url, path, payloads))
    wall = time.perf_counter() - t0
    c1 = counters(server.url)
    return {"wall": wall, "server_cpu": cpu_seconds(server.proc.pid) - s0,
            "sched_cpu": sum(map(cpu_seconds, kids)) - k0,
            **{k: c1[k] - c0[k] for k in c1}}


def lone(servers: dict[str, sp.Server], path: str, body: dict[str, Any],
         n: int) -> dict[str, float]:
    """Median latency (ms) of one request at a time per server, the servers taking turns
    request by request (side by side, they see the same load)."""
    times: dict[str, list[float]] = {name: [] for name in servers}
    clients = {name: httpx.Client(base_url=s.url, timeout=600) for name, s in servers.items()}
    try:
        for _ in range(n):
            for name, client in clients.items():
                t0 = time.perf_counter()
                client.post(path, json=body).raise_for_status()
                times[name].append(1000 * (time.perf_counter() - t0))
    finally:
        for client in clients.values():
            client.close()
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    a = parse_args()
    kw = bsp.engine_kwargs(a)
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(EngineConfig(**kw), kw["model"])
    texts, ids, users = bsp.prompts(tok, a, a.requests)
    model = kw.pop("model")
    flags = ["--model", model, *sp.server_flags(kw)]
    variants = {name: (sys.executable, flags + VARIANTS[name]) for name in a.variants}
    for spec in a.python:
        name, python = spec.split("=", 1)
        variants[name] = (python, flags)
    print(device_line(), flush=True)
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    groups = [list(variants)] if a.together else [[name] for name in variants]
    for group in groups:  # side by side (rounds interleaved) or one server at a time
        servers = {name: sp.Server(variants[name][1], python=variants[name][0])
                   for name in group}
        try:
            run_group(a, servers, texts, ids, users, rows)
        finally:
            for server in servers.values():
                server.stop()
    table(a, rows)


def run_group(a: argparse.Namespace, servers: dict[str, sp.Server], texts: list[str],
              ids: list[list[int]], users: list[str], rows: dict) -> None:
    for server in servers.values():  # warm-up: compiles, first forwards
        for route in a.routes:
            path, payloads = bodies(route, texts[:8], ids[:8], users[:8], 4)
            asyncio.run(post_all(server.url, path, payloads))
    for r in range(a.rounds):
        for name, server in servers.items():
            for route in a.routes:
                path, payloads = bodies(route, texts, ids, users, a.max_new)
                rows.setdefault((name, route), []).append(m := burst(server, path, payloads))
                print(f"round {r} {name} {route}: {json.dumps(m)}", flush=True)
    for route in ("native", "chat"):
        path, payloads = bodies(route, texts[:1], ids[:1], users[:1], 1)
        for name, ms in lone(servers, path, payloads[0], a.lone).items():
            print(f"lone {name} {route}: median {ms:.1f} ms over {a.lone}", flush=True)


def table(a: argparse.Namespace, rows: dict[tuple[str, str], list[dict[str, float]]]) -> None:
    print(f"\n## burst of {a.requests} (prompt {a.prompt_len}, max_new {a.max_new}), "
          f"medians of {a.rounds} rounds")
    print("| server | route | wall s | server cpu ms/req | sched cpu s | engine hand-offs | "
          "prefill waves | forwards |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, route), ms in rows.items():
        med = {k: statistics.median(m[k] for m in ms) for k in ms[0]}
        print(f"| {name} | {route} | {med['wall']:.2f} | "
              f"{1000 * med['server_cpu'] / a.requests:.2f} | {med['sched_cpu']:.2f} | "
              f"{med['submit_handoffs']:.0f} | {med['extend_steps']:.0f} | "
              f"{med['forward_steps']:.0f} |")


if __name__ == "__main__":
    main()

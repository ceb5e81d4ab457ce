"""Where the HTTP path's time goes: N concurrent requests against ``sgdsl serve`` from httpx
and from aiohttp (the peer client), with each process's CPU seconds. ``--routes`` picks what is
sent: native ``/generate`` (token ids), ``chat`` (``/v1/chat/completions``, a text message) and
``chat-json`` (the same with ``response_format`` json_schema), so the chat route's own cost
reads as server CPU per request beside native's.

On a loaded or small host wall times move with everything else running; CPU seconds per
process do not, and they say who pays: the client (its own process), the server's main
process (HTTP, the Engine's front-end) or the scheduler process. ``--python`` adds servers run
by other interpreters (e.g. another tree's venv, for a before/after in the same run); rounds
interleave the servers. ignore_eos everywhere, tiny dummy Llama.

    python benchmarks/bench_http_path.py --requests 256 --new-tokens 32 \\
        --python base=/path/to/other/tree/.venv/bin/python
    python benchmarks/bench_http_path.py --clients aiohttp --routes native chat chat-json
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # imported by other scripts too
from proc_stats import cpu_seconds  # noqa: E402
from tiny_llama import tiny_llama_dir  # noqa: E402



def children(pid: int) -> list[int]:
    kids = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d))
        except OSError:
            pass
    return kids


def start(python: str, model: str, a: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [python, "-m", "sgdsl.runtime.server", "--model", model, "--port", "0",
           "--load-format", "dummy", "--num-threads", "1",
           "--grammar-backend", "xgrammar" if "chat-json" in a.routes else "none",
           "--max-running-requests", str(a.requests),
           "--max-total-tokens", str(a.requests * (a.prompt_len + a.new_tokens) + 1024)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, re.search(r"(http://\S+)", proc.stdout.readline()).group(1)


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
    "city": {"type": "string", "maxLength": 20}}, "required": ["name", "age", "city"]}
PATH = {"native": "/generate", "chat": "/v1/chat/completions", "chat-json": "/v1/chat/completions"}


def route_bodies(route: str, a: argparse.Namespace, rng: random.Random) -> list[dict]:
    """``a.requests`` bodies for ``route`` (prompts of ~``a.prompt_len`` tokens)."""
    if route == "native":
        sp = {"max_new_tokens": a.new_tokens, "ignore_eos": True, "temperature": 0.0}
        return [{"input_ids": [rng.randrange(100, 40000) for _ in range(a.prompt_len)],
                 "sampling_params": sp} for _ in range(a.requests)]
    words = ["alpha", "beta", "gamma", "delta", "city", "person", "river", "stone"]
    extra = ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON}}} if route == "chat-json" else {})
    return [{"model": "default", "max_tokens": a.new_tokens, "temperature": 0.0,
             "ignore_eos": route == "chat", **extra,
             "messages": [{"role": "user", "content": " ".join(
                 rng.choice(words) for _ in range(a.prompt_len))}]}
            for _ in range(a.requests)]


def n_tokens(out: dict) -> int:
    if "output_ids" in out:
        return len(out["output_ids"])
    return out["usage"]["completion_tokens"]


async def httpx_batch(url: str, path: str, bodies: list[dict]) -> list[dict]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        async def one(body: dict) -> dict:
            return (await client.post(path, json=body)).json()
        return await asyncio.gather(*(one(b) for b in bodies))


async def aiohttp_batch(url: str, path: str, bodies: list[dict]) -> list[dict]:
    import aiohttp

    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=0)) as client:
        async def one(body: dict) -> dict:
            async with client.post(path, json=body) as resp:
                return await resp.json()
        return await asyncio.gather(*(one(b) for b in bodies))


def measure(proc: subprocess.Popen, url: str, client: str, path: str,
            bodies: list[dict]) -> dict[str, Any]:
    httpx.post(url + "/flush_cache", timeout=60)
    kids = children(proc.pid)
    s0, k0, c0 = cpu_seconds(proc.pid), sum(map(cpu_seconds, kids)), time.process_time()
    t0 = time.perf_counter()
    batch = httpx_batch if client == "httpx" else aiohttp_batch
    outs = asyncio.run(batch(url, path, bodies))
    wall = time.perf_counter() - t0
    return {"wall": wall, "tokens": sum(map(n_tokens, outs)),
            "server_cpu": cpu_seconds(proc.pid) - s0, "scheduler_cpu": sum(map(cpu_seconds, kids)) - k0,
            "client_cpu": time.process_time() - c0, "n": len(bodies)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--routes", nargs="+", default=["native"], choices=list(PATH))
    ap.add_argument("--clients", nargs="+", default=["httpx", "aiohttp"],
                    choices=["httpx", "aiohttp"])
    ap.add_argument("--python", action="append", default=[], metavar="NAME=PATH",
                    help="another server interpreter (repeatable); this one is 'this'")
    a = ap.parse_args()
    rng = random.Random(0)
    bodies = {route: route_bodies(route, a, rng) for route in a.routes}
    model = tiny_llama_dir(max_positions=2048)
    pythons = [("this", sys.executable)] + [tuple(p.split("=", 1)) for p in a.python]
    clients = [c for c in a.clients if c == "httpx" or _has_aiohttp()]
    servers = {name: start(py, model, a) for name, py in pythons}
    try:
        for name, (proc, url) in servers.items():
            for route in a.routes:  # warm-up (the json route's schema compiles here)
                measure(proc, url, clients[-1], PATH[route], bodies[route][:8])
        for r in range(a.rounds):
            for name, (proc, url) in servers.items():
                for client in clients:
                    for route in a.routes:
                        report(r, name, client, route,
                               measure(proc, url, client, PATH[route], bodies[route]))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)


def report(r: int, name: str, client: str, route: str, m: dict[str, Any]) -> None:
    print(f"round {r} server {name:6s} client {client:7s} {route:9s} wall {m['wall']:6.2f} s"
          f"  {m['tokens'] / m['wall']:6.0f} tok/s  cpu: server {m['server_cpu']:.2f} s"
          f" ({1000 * m['server_cpu'] / m['n']:.2f} ms/request), scheduler "
          f"{m['scheduler_cpu']:.2f} s, client {m['client_cpu']:.2f} s", flush=True)


def _has_aiohttp() -> bool:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()

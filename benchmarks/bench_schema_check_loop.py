"""The server's event loop while a new JSON schema is checked (branch schema-offloop).

A new (schema, max_new_tokens) pair's request pays the request builder's checks (the JSON
Schema meta-schema in jsonschema, the size limits, the vacuous bounds). This runs ``sgdsl
serve``'s app in-process (uvicorn in a thread, a tiny random Llama Engine on the CPU) and,
per round, sends one request with a schema the server has not seen while a second client
sends plain one-token requests back to back. Measured: the longest gap between ticks of a
1 ms ticker on the server's loop while the schema request is in flight (the loop's blocked
time), the schema request's own latency, and the plain requests' latencies meanwhile (vs.
the same plain requests with nothing else in flight). Both arms in the same run: ``offloop``
(this tree: the check in the Engine's check pool) and ``inline`` (the check pool bypassed:
the check runs where the request is built, on the loop, as before).

    OMP_NUM_THREADS=1 python benchmarks/bench_schema_check_loop.py --rounds 7 --properties 300
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
import uuid

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_llama import tiny_llama_dir  # noqa: E402

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def big_schema(properties: int) -> dict:
    """An object of ``properties`` nested objects (~180 bytes each), unique per call."""
    item = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "count": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "kind": {"enum": ["a", "b", "c"]}}, "required": ["name", "count"]}
    return {"type": "object", "title": uuid.uuid4().hex,
            "properties": {f"p{i}": item for i in range(properties)}, "required": ["p0"]}


class Ticker:
    """A 1 ms ticker on ``loop``; ``max_gap()`` since the last ``reset()``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.gap = 0.0
        self.stop = False
        asyncio.run_coroutine_threadsafe(self._run(), loop)

    async def _run(self) -> None:
        last = time.perf_counter()
        while not self.stop:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.gap = max(self.gap, now - last - 0.001)
            last = now

    def reset(self) -> None:
        self.gap = 0.0


def _native(**extra: object) -> dict:
    return {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0,
                                                     "ignore_eos": True, **extra}}


def one_round(client: httpx.Client, ticker: Ticker, properties: int) -> dict:
    """Plain requests back to back while one new-schema request is in flight."""
    done = threading.Event()
    out: dict = {}

    def schema_request() -> None:
        start = time.perf_counter()
        resp = client.post("/generate", json=_native(json_schema=json.dumps(big_schema(
            properties))))
        out["schema_ms"] = (time.perf_counter() - start) * 1e3
        out["status"] = resp.status_code
        done.set()

    ticker.reset()
    worker = threading.Thread(target=schema_request)
    worker.start()
    plain = []
    with httpx.Client(base_url=str(client.base_url), timeout=120) as other:
        while not done.is_set():
            start = time.perf_counter()
            other.post("/generate", json=_native())
            plain.append((time.perf_counter() - start) * 1e3)
    worker.join()
    out["gap_ms"] = ticker.gap * 1e3
    out["plain_ms"] = plain
    return out


def idle_plain(client: httpx.Client, n: int = 30) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        client.post("/generate", json=_native())
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--properties", type=int, default=300)
    a = ap.parse_args()
    from sgdsl.runtime import Engine
    from sgdsl.runtime.server.app import create_app
    from sgdsl.runtime.server.thread_server import ThreadServer

    engine = Engine(tiny_llama_dir(), load_format="dummy", device="cpu", num_threads=1)
    server = ThreadServer(create_app(engine))
    url = server.start()
    ticker = Ticker(server.server.servers[0].get_loop())
    size = len(json.dumps(big_schema(a.properties)))
    print(f"schema: {a.properties} properties, {size} bytes; rounds {a.rounds} per arm")
    offloop_waiting = engine._checks.waiting
    rows: dict[str, list[dict]] = {"offloop": [], "inline": []}
    with httpx.Client(base_url=url, timeout=120) as client:
        idle_plain(client, 10)  # warm
        ticker.reset()
        idle = idle_plain(client)
        idle_gap = ticker.gap * 1e3
        for r in range(a.rounds):
            for arm in ("offloop", "inline") if r % 2 == 0 else ("inline", "offloop"):
                engine._checks.waiting = offloop_waiting if arm == "offloop" else (
                    lambda sp: None)
                rows[arm].append(one_round(client, ticker, a.properties))
    ticker.stop = True
    server.stop()
    engine.shutdown()
    print(f"plain request, nothing else in flight: median {statistics.median(idle):.2f} ms, "
          f"max {max(idle):.2f} ms; loop max gap meanwhile {idle_gap:.1f} ms")
    med = {}
    for arm, rs in rows.items():
        assert all(r["status"] == 200 for r in rs), rs
        gaps = [r["gap_ms"] for r in rs]
        sch = [r["schema_ms"] for r in rs]
        plain = [p for r in rs for p in r["plain_ms"]]
        first = [r["plain_ms"][0] for r in rs]
        med[arm] = statistics.median(gaps), statistics.median(first)
        print(f"{arm:8s} loop max gap ms: median {statistics.median(gaps):7.1f} max "
              f"{max(gaps):7.1f} | schema request ms: median {statistics.median(sch):7.1f} | "
              f"plain requests meanwhile: {len(plain)}, first ms median "
              f"{statistics.median(first):7.1f} max {max(first):7.1f}, all ms median "
              f"{statistics.median(plain):6.2f} max {max(plain):7.1f}")
    print(f"ratios offloop/inline: loop gap {med['offloop'][0] / med['inline'][0]:.3f}, "
          f"first plain latency {med['offloop'][1] / med['inline'][1]:.3f}")


if __name__ == "__main__":
    main()

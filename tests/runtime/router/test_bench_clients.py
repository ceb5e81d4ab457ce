"""benchmarks/bench_router.py's ``--client-procs``: the workload split over client processes
(every prompt sent once, the concurrency shared, one wall clock) against a stub worker that
counts what it sees."""
from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

from fastapi import FastAPI, Request

from sgdsl.runtime.server.thread_server import ThreadServer

_PATH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_router.py"


def _stub() -> tuple[FastAPI, dict]:
    app, seen = FastAPI(), {"texts": [], "inflight": 0, "peak": 0}

    @app.post("/generate")
    async def generate(request: Request) -> dict:
        text = (await request.json())["text"]
        seen["texts"].append(text)
        seen["inflight"] += 1
        seen["peak"] = max(seen["peak"], seen["inflight"])
        await asyncio.sleep(0.02)
        seen["inflight"] -= 1
        return {"text": "ok", "meta_info": {"prompt_tokens": len(text), "completion_tokens": 2}}

    return app, seen


def _load():
    spec = importlib.util.spec_from_file_location("bench_router", _PATH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_router"] = bench  # the client processes unpickle their target by name
    spec.loader.exec_module(bench)
    return bench


def test_decisions_are_summed_by_reason_from_the_router_metrics(monkeypatch):
    from sgdsl.runtime.router.metrics import RouterMetrics

    bench = _load()
    sys.modules.pop("bench_router", None)
    metrics = RouterMetrics()
    for worker, reason, n in (("a", "affinity", 3), ("b", "affinity", 2), ("b", "least_work", 7)):
        metrics.decisions.labels(policy="cost_aware", worker=f"http://{worker}:1",
                                 reason=reason).inc(n)
    answer = type("Answer", (), {"text": metrics.render().decode()})
    monkeypatch.setattr(bench.httpx, "get", lambda *args, **kwargs: answer)
    assert bench.decisions("http://router", {}) == {"affinity": 5, "least_work": 7}


def test_client_processes_send_every_prompt_once_within_the_concurrency():
    sys.path.insert(0, str(_PATH.parent))
    try:
        bench = _load()
        app, seen = _stub()
        server = ThreadServer(app)
        url = server.start()
        try:
            prompts = [f"prompt {i} " * (i % 5 + 1) for i in range(120)]
            args = bench.parse_args(["--concurrency", "10", "--client-procs", "3"])
            totals = bench.run_clients(url, prompts, args, {})
        finally:
            server.stop()
    finally:
        sys.modules.pop("bench_router", None)
        sys.path.remove(str(_PATH.parent))
    assert sorted(seen["texts"]) == sorted(prompts)
    assert 3 <= seen["peak"] <= 10
    assert totals["failed"] == 0 and totals["completion_tokens"] == 2 * len(prompts)
    assert totals["prompt_tokens"] == sum(len(p) for p in prompts)
    assert 0 < totals["seconds"] < 120 and totals["client_cpu_s"] > 0

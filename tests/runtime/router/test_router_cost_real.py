"""cost_aware over two real servers on loopback (two Engines in this process): the workers'
GET /load, the router polling it, requests spread over both workers, a shared prefix kept on
the worker that caches it, the characters-per-token ratio learned.

The engines run the tiny random model with the embedded model's tokenizer (tests/conftest.py):
routing, /load and the prefix cache need token counts, not meaningful text, and two loads of
the embedded model plus its 256-token decode cost the 2-core CI box tens of seconds."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import pytest

from sgdsl.runtime.router.app import create_app as create_router
from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.server.app import create_app
from sgdsl.runtime.server.thread_server import ThreadServer

pytestmark = pytest.mark.slow
LOAD_KEYS = {"num_waiting_reqs", "num_running_reqs", "queued_prefill_tokens",
             "remaining_decode_tokens", "running_kv_tokens", "kv_total_slots", "kv_free_slots",
             "kv_evictable_slots", "kv_usage", "prompt_tokens_total"}


@pytest.fixture(scope="module")
def workers(tiny_model_dir) -> Iterator[list[str]]:
    from sgdsl.runtime import Engine

    # NOTE: no grammar backend (no test here sends one): its compile and estimate workers are
    # three processes per engine that import torch, most of a tiny engine's start-up CPU.
    engines = [Engine(str(tiny_model_dir), load_format="dummy", num_threads=1,
                      max_total_tokens=8192, grammar_backend="none") for _ in range(2)]
    servers = [ThreadServer(create_app(e)) for e in engines]
    try:
        yield [s.start() for s in servers]
    finally:
        for server in servers:
            server.stop()
        for engine in engines:
            engine.check_idle_integrity()
            engine.shutdown()


@pytest.fixture(scope="module")
def router(workers) -> Iterator[str]:
    server = ThreadServer(create_router(RouterConfig(worker_urls=tuple(workers),
                                                     load_interval_s=0.05)))
    yield server.start()
    server.stop()


def generate(url: str, text: str, tokens: int) -> httpx.Response:
    r = httpx.post(f"{url}/generate", timeout=300, json={"text": text, "sampling_params": {
        "max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r


def test_load_reports_an_idle_and_a_busy_worker(workers):
    idle = httpx.get(f"{workers[0]}/load", timeout=30).json()
    assert set(idle) == LOAD_KEYS
    assert idle["num_waiting_reqs"] == idle["num_running_reqs"] == 0
    assert idle["queued_prefill_tokens"] == idle["remaining_decode_tokens"] == 0
    assert idle["kv_total_slots"] > 0 and 0.0 <= idle["kv_usage"] <= 1.0
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(generate, workers[0], "Once upon a time", 256)
        busy = None
        while not answer.done():
            body = httpx.get(f"{workers[0]}/load", timeout=30).json()
            if body["num_running_reqs"] == 1:
                busy = body
                break
        answer.result()
    assert busy is not None, "the request finished before /load ever saw it running"
    assert 0 < busy["remaining_decode_tokens"] <= 256
    assert busy["running_kv_tokens"] > 0 and busy["kv_usage"] > 0


def served(router: str) -> dict[str, int]:
    listing = httpx.get(f"{router}/list_workers", timeout=30).json()
    assert listing["policy"] == "cost_aware"
    return {w["url"]: w["served"] for w in listing["workers"]}


def test_requests_spread_and_a_shared_prefix_stays_with_its_cache(router, workers):
    before = served(router)
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: generate(router, f"Story {i}: a fox and a crow", 16), range(6)))
    spread = {u: n - before[u] for u, n in served(router).items()}
    assert min(spread.values()) >= 2, spread  # both workers took part of the burst

    system = "You are a careful assistant who answers in one short sentence. " * 12
    before = served(router)
    for q in ("What is a fox?", "What is a crow?", "What is a river?"):
        generate(router, system + q, 4)  # one at a time: loads stay equal, the cache decides
    moved = {u: n - before[u] for u, n in served(router).items()}
    assert sorted(moved.values()) == [0, 3], moved

    listing = httpx.get(f"{router}/list_workers", timeout=30).json()
    assert listing["chars_per_token"] != 4.0  # learned from the answers' prompt_tokens
    deadline = time.monotonic() + 60
    while any(w["work"]["report"] is None for w in listing["workers"]):  # polled /load
        assert time.monotonic() < deadline, listing
        time.sleep(0.1)
        listing = httpx.get(f"{router}/list_workers", timeout=30).json()
    assert all(w["work"]["booked"] == 0 for w in listing["workers"])  # all answered
    metrics = httpx.get(f"{router}/metrics", timeout=30).text
    assert 'sgdsl_router_policy_decisions_total{policy="cost_aware"' in metrics
    assert all(f'sgdsl_router_worker_work_tokens{{worker="{w}"}}' in metrics for w in workers)
    assert httpx.get(f"{router}/debug/check_idle_integrity", timeout=60).status_code == 200

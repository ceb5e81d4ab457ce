"""The router over real servers of the tiny random model: ``sgdsl serve --dp-size 2`` (two
replica servers behind its router) plus routers in this process over the same replicas.
Shared-prefix hit rates, streaming through the router vs direct, failover on a killed replica."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from sgdsl.runtime.router.app import create_app
from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.server.thread_server import ThreadServer
from processes import descendants, stop_tree, url_of

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from bench_router import cache_counters  # noqa: E402  (the benchmark's own hit-rate reading)

pytestmark = pytest.mark.slow
KEY = "router-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class DP:
    url: str
    proc: subprocess.Popen
    workers: list[str]


@pytest.fixture(scope="module")
def dp(tiny_model_dir) -> Iterator[DP]:
    cmd = [sys.executable, "-m", "sgdsl.runtime.launcher", "--model", str(tiny_model_dir),
           "--load-format", "dummy", "--num-threads", "1", "--max-total-tokens", "8192",
           "--host", "127.0.0.1", "--port", "0", "--api-key", KEY, "--dp-size", "2",
           "--router-policy", "round_robin",
           # no test here sends a grammar: no compile or estimate workers (three processes per
           # replica that import torch, most of a tiny replica's start-up CPU)
           "--grammar-backend", "none"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = url_of(proc)
    workers = [w["url"] for w in httpx.get(f"{url}/list_workers", headers=AUTH).json()["workers"]]
    yield DP(url, proc, workers)
    # uvicorn re-raises the SIGTERM it drained on; the replicas are stopped before that.
    assert stop_tree(proc, timeout_s=120) in (0, -signal.SIGTERM)


def _pid_listening_on(port: int, pids: list[int]) -> int:
    """Which of ``pids`` holds the listening socket of ``port`` (via /proc socket inodes)."""
    inodes = set()
    for line in open("/proc/net/tcp").readlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and f[3] == "0A":
            inodes.add(f"socket:[{f[9]}]")
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no process of {pids} listens on {port}")


@pytest.fixture(scope="module")
def routers(dp) -> Iterator[dict[str, str]]:
    """A cache_aware and a round_robin router in this process over the dp replicas."""
    servers, urls = [], {}
    for policy in ("cache_aware", "round_robin"):
        config = RouterConfig(worker_urls=tuple(dp.workers), policy=policy, worker_api_key=KEY)
        servers.append(ThreadServer(create_app(config)))
        urls[policy] = servers[-1].start()
    yield urls
    for s in servers:
        s.stop()


def shared_prefix_prompts(groups: int, per_group: int, seed: int) -> list[str]:
    """SGLang's generated-shared-prefix shape, small: a long system prompt per group, a short
    question per prompt; shuffled so that arrival order does not line groups up with workers."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta river stone cloud maple orbit quartz signal harbor".split()
    prompts = []
    for g in range(groups):
        system = f"System {seed}-{g}: " + " ".join(rng.choice(words) for _ in range(120))
        prompts += [f"{system}\nQuestion {q}: {rng.choice(words)}?" for q in range(per_group)]
    rng.shuffle(prompts)
    return prompts


def summed_hit_rate(url: str, workers: list[str], prompts: list[str]) -> float:
    """The workload through the router at ``url``; hit rate from the workers' /metrics."""
    with httpx.Client(base_url=url, timeout=120) as c:
        assert c.post("/flush_cache").status_code == 200  # broadcast to every worker
        hit0, prompt0 = cache_counters(workers, AUTH)
        for prompt in prompts:
            r = c.post("/generate", json={"text": prompt, "sampling_params": {
                "max_new_tokens": 1, "temperature": 0}})
            assert r.status_code == 200, r.text
    hit1, prompt1 = cache_counters(workers, AUTH)
    assert prompt1 > prompt0
    return (hit1 - hit0) / (prompt1 - prompt0)


def test_dp_serve_answers_every_protocol_and_the_runtime_endpoint(dp):
    import sgdsl as sgl
    from sgdsl.backends.runtime_endpoint import RuntimeEndpoint

    assert len(dp.workers) == 2
    assert httpx.post(f"{dp.url}/generate", json={"text": "hi"}).status_code == 401
    backend = RuntimeEndpoint(dp.url, api_key=KEY)

    @sgl.function
    def prog(s):
        s += "Count: one, two," + sgl.gen("x", max_tokens=4, temperature=0)

    outs = {prog.run(backend=backend)["x"] for _ in range(4)}  # both replicas: same weights
    assert len(outs) == 1
    chat = httpx.post(f"{dp.url}/v1/chat/completions", headers=AUTH, timeout=60, json={
        "model": "default", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 3


def test_cache_aware_hits_more_than_round_robin_on_shared_prefixes(routers, dp):
    rr = summed_hit_rate(routers["round_robin"], dp.workers, shared_prefix_prompts(6, 4, seed=1))
    ca = summed_hit_rate(routers["cache_aware"], dp.workers, shared_prefix_prompts(6, 4, seed=2))
    # Each group's prefix is computed once under cache_aware, about twice under round_robin.
    print(f"summed hit rate: cache_aware {ca:.3f}, round_robin {rr:.3f}")
    assert ca > rr + 0.1, (ca, rr)


def _events(url: str, path: str, body: dict) -> list[dict]:
    with httpx.Client(timeout=60, headers=AUTH) as c:
        r = c.post(url + path, json=body)
    assert r.status_code == 200
    data = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def _summary(events: list[dict]) -> dict:
    """What a stream carries, independent of how tokens were grouped into events (that
    depends on timing): the text assembled from the deltas and the last event's fields."""
    last = events[-1]
    if "choices" in last:
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        return {"text": text, "finish_reason": last["choices"][0]["finish_reason"]}
    meta = {k: v for k, v in last["meta_info"].items()
            if k not in ("id", "cached_tokens", "e2e_latency")}  # per request, timing
    return {"text": "".join(e["delta"] for e in events), "final_text": last["text"],
            "output_ids": last["output_ids"], "meta_info": meta}


@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": "Once upon a time", "stream": True,
                   "sampling_params": {"max_new_tokens": 8, "temperature": 0}}),
    ("/v1/chat/completions", {"model": "default", "max_tokens": 8, "stream": True,
                              "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}),
])
def test_streaming_through_the_router_equals_streaming_direct(routers, dp, path, body):
    routed = _summary(_events(routers["cache_aware"], path, body))
    for worker in dp.workers:
        assert _summary(_events(worker, path, body)) == routed
    assert routed["text"]


def test_killing_a_replica_mid_run_loses_no_request(dp):
    body = {"text": "Tell me a story", "sampling_params": {
        "max_new_tokens": 128, "temperature": 0, "ignore_eos": True}}

    def call(_: int) -> httpx.Response:
        return httpx.post(f"{dp.url}/generate", json=body, headers=AUTH, timeout=120)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(call, i) for i in range(8)]
        victim = _busy_worker(dp)
        port = int(victim.rsplit(":", 1)[1])
        os.kill(_pid_listening_on(port, descendants(dp.proc.pid)), signal.SIGKILL)
        results = [f.result() for f in futures]
    assert [r.status_code for r in results] == [200] * 8
    assert {r.json()["meta_info"]["completion_tokens"] for r in results} == {128}
    assert len({r.json()["text"] for r in results}) == 1
    metrics = httpx.get(f"{dp.url}/metrics", headers=AUTH).text
    assert 'sgdsl_router_retries_total{route="/generate"}' in metrics  # some were interrupted
    after = httpx.post(f"{dp.url}/generate", json=body, headers=AUTH, timeout=120)
    assert after.status_code == 200
    survivor = next(w for w in dp.workers if w != victim)
    assert httpx.get(f"{survivor}/debug/check_idle_integrity", headers=AUTH).status_code == 200


def _busy_worker(dp: DP) -> str:
    """A replica with requests in flight (so that killing it interrupts them)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = httpx.get(f"{dp.url}/list_workers", headers=AUTH).json()["workers"]
        busy = [w["url"] for w in workers if w["load"] > 0]
        if busy:
            return busy[-1]
        time.sleep(0.01)
    raise AssertionError("no replica ever had a request in flight")

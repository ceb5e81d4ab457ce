"""``sgdsl serve --dp-size 2 --tp-size 2`` on CPU: two replicas, each a TP group of two gloo
ranks, behind the router. Each replica answers with TP=2, both give the TP=1 greedy tokens
(dummy weights are the same model at any TP), through the router and directly, and SIGTERM
leaves no process behind."""
from __future__ import annotations

import signal
import subprocess
import sys
from typing import Iterator

import httpx
import pytest
from processes import descendants, stop_tree, url_of

pytestmark = pytest.mark.slow
PROMPTS = ["Hi", "The capital of France is", "def fibonacci(n):\n    "]
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def served(tiny_model_dir) -> Iterator[tuple[str, subprocess.Popen]]:
    cmd = [sys.executable, "-m", "sgdsl.runtime.launcher", "--model", str(tiny_model_dir),
           "--load-format", "dummy", "--device", "cpu", "--num-threads", "1",
           "--max-total-tokens", "4096", "--dp-size", "2", "--tp-size", "2",
           # one compile worker per rank, not two (each imports torch; the ranks' helper
           # processes stay in the family that SIGTERM must leave nothing of)
           "--grammar-compile-workers", "1",
           "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield url_of(proc), proc
    if proc.poll() is None:
        proc.kill()


def outputs(url: str) -> list[list[int]]:
    r = httpx.post(f"{url}/generate", timeout=300, json={"text": PROMPTS,
                                                          "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    return [item["output_ids"] for item in r.json()]


def test_dp2_tp2_equals_tp1_and_stops_cleanly(served, tiny_engine):
    url, proc = served
    workers = [w["url"] for w in httpx.get(f"{url}/list_workers", timeout=30).json()["workers"]]
    assert len(workers) == 2
    for worker in workers:
        info = httpx.get(f"{worker}/get_server_info", timeout=30).json()
        assert info["tp_size"] == 2
    want = [r["output_ids"] for r in tiny_engine.generate(PROMPTS, GREEDY)]
    assert outputs(url) == want
    for worker in workers:
        assert outputs(worker) == want
        assert httpx.get(f"{worker}/load", timeout=30).json()["num_running_reqs"] == 0
    assert httpx.get(f"{url}/debug/check_idle_integrity", timeout=60).status_code == 200
    assert len(descendants(proc.pid)) >= 2 + 4  # two replica servers, four ranks (+ helpers)
    # a rank may still be exiting when its parent is gone
    assert stop_tree(proc, timeout_s=120) in (0, -signal.SIGTERM)

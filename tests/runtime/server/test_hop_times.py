"""Hop times ($SGDSL_HOP_TIMES=1, runtime/hop_times.py) on loopback: a server (``sgdsl serve``
process of the tiny random model) behind a router (``python -m sgdsl.runtime.router``), both
with the variable set. Every streamed native chunk carries its scheduler/receive/build/write
times, its steps, and the router's comment; the official OpenAI client streams through the
same router unharmed; the benchmark's client (``benchmarks/gpu/pd_client.py``, split over two
processes) and its report (``hop_report.py``) read them. (The relay is the one a PD router
uses for the decode half: test_pd_real.py streams through it.) No timing is asserted: only
that each stamp is there, in hop order."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from processes import stop_tree, url_of

pytestmark = pytest.mark.slow
TIMEOUT = 120.0
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "gpu"))
import hop_report  # noqa: E402
import pd_client  # noqa: E402

SLACK_S = 0.05  # time.time() is one clock for every process here; allow for its resolution


def _spawn(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "SGDSL_HOP_TIMES": "1"}
    return subprocess.Popen([sys.executable, "-m", *args, "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _server(model_dir: Path) -> subprocess.Popen:
    return _spawn(["sgdsl.runtime.launcher", "--model", str(model_dir), "--load-format", "dummy",
                   "--num-threads", "1", "--max-total-tokens", "4096",
                   # no test here sends a grammar: no zygote, compile or estimate workers
                   "--grammar-backend", "none"])


@pytest.fixture(scope="module")
def router(tiny_model_dir) -> Iterator[str]:
    procs = [_server(tiny_model_dir)]
    try:
        procs.append(_spawn(["sgdsl.runtime.router", "--worker-urls", url_of(procs[0])]))
        yield url_of(procs[-1])
    finally:
        for proc in reversed(procs):
            stop_tree(proc)


def _stream_lines(url: str) -> list[str]:
    body = {"text": "The history of the river valley", "stream": True,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def test_every_chunk_carries_its_hop_times_in_order(router):
    lines = _stream_lines(router)
    events = [json.loads(line[5:]) for line in lines
              if line.startswith("data:") and line != "data: [DONE]"]
    assert events and events[-1]["meta_info"]["completion_tokens"] == 12
    waiting, comments = 0, 0  # the router's time follows every read it passed on
    for line in lines:
        if line.startswith(pd_client.ROUTER_PREFIX):
            waiting, comments = 0, comments + 1
        elif line.startswith("data:") and line != "data: [DONE]":
            waiting += 1
    assert comments and not waiting
    for event in events:
        stamps = event["meta_info"]["hop_times"]
        assert len(stamps) == len(hop_report.SERVER_HOPS)
        assert all(b >= a - SLACK_S for a, b in zip(stamps, stamps[1:])), stamps
        steps, held = event["meta_info"]["hop_steps"]
        assert steps >= 1 and 0 <= held < steps


def test_openai_client_streams_through_the_stamped_router(router):
    client = openai.OpenAI(base_url=f"{router}/v1", api_key="none", timeout=TIMEOUT)
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        temperature=0.0, stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks and chunks[-1].choices[-1].finish_reason == "length"


def test_bench_client_split_over_processes_reports_where_gaps_were_born(router):
    arrivals = [(0.05 * i, list(range(1000, 1000 + 16 + 8 * i)), 8) for i in range(4)]
    results, wall, cpu = pd_client.run_split(router, arrivals, procs=2)
    assert wall > 0 and cpu >= 0
    assert [r["prompt"] for r in results] == [len(ids) for _, ids, _ in arrivals]  # in order
    assert all(r["output"] == 8 and r["events"] for r in results)
    names, pairs = hop_report.pairs(results)
    assert names == [*hop_report.SERVER_HOPS, "router", "client"] and pairs
    report = hop_report.summarize(results, "hops")
    assert "sched -> recv" in report and "router -> client" in report and "born there" in report

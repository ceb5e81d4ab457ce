"""Disaggregation with tensor parallelism on either side (CPU, gloo), one cluster of real
servers of the tiny model (2 kv heads) on loopback: prefill servers at tp_size 1 and 2, decode
servers at tp_size 1 and 2, and a PD router per pairing:

- prefill TP=1 -> decode TP=2: each decode rank receives its head from the one prefill rank;
- prefill TP=2 -> decode TP=1: the decode pool gets each head from the prefill rank holding it
  (two groups, staged into the heads' columns);
- prefill TP=2 -> decode TP=2: each decode rank from its twin (in place).

Greedy answers equal the TP=1 decode server's own colocated answers (same dummy weights) token
for token, with requests arriving together (their transfers end on the ranks at different
moments, yet every rank of a side must start, land and free each request in the same step); a
JSON-schema request through a TP=2 prefill server is valid; every rank of every server ends
idle, also after the last test kills a decode server mid-run."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import pytest

from sgdsl.runtime.router.app import create_app
from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.server.thread_server import ThreadServer
from processes import free_port, stop_tree, url_of

from .test_pd_real import PROMPTS, TIMEOUT, _gen, _idle, _stats

pytestmark = pytest.mark.slow
PAIRS = {"p1-d2": ("p1", "d2"), "p2-d1": ("p2", "d1"), "p2-d2": ("p2", "d2")}


def _start(model_dir, mode: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sgdsl.runtime.launcher", "--model", str(model_dir),
           "--load-format", "dummy", "--num-threads", "1", "--max-total-tokens", "4096",
           "--host", "127.0.0.1", "--port", "0", "--grammar-compile-workers", "1",
           "--disaggregation-mode", mode, "--disaggregation-timeout-s", "60", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir) -> Iterator[dict]:
    ports = {"p1": free_port(), "p2": free_port()}
    # NOTE: p1 serves no constrained request: no grammar worker to start
    procs = {"p1": _start(tiny_model_dir, "prefill", "--disaggregation-bootstrap-port",
                          str(ports["p1"]), "--grammar-backend", "none"),
             "p2": _start(tiny_model_dir, "prefill", "--disaggregation-bootstrap-port",
                          str(ports["p2"]), "--tp-size", "2"),
             "d1": _start(tiny_model_dir, "decode"),
             "d2": _start(tiny_model_dir, "decode", "--tp-size", "2")}
    routers = []
    try:
        urls = {name: url_of(p) for name, p in procs.items()}
        for name, (p, d) in PAIRS.items():
            config = RouterConfig(pd_disaggregation=True, prefill_urls=(urls[p],),
                                  prefill_bootstrap_ports=(ports[p],), decode_urls=(urls[d],),
                                  health_interval_s=0.5, health_timeout_s=30.0, max_retries=0)
            routers.append(ThreadServer(create_app(config)))
            urls[name] = routers[-1].start()
        yield {**urls, "procs": procs}
    finally:
        for router in routers:
            router.stop()
        for proc in procs.values():
            stop_tree(proc)


def test_every_tp_pairing_equals_colocated_token_for_token(cluster):
    jobs = [(pair, p) for pair in PAIRS for p in PROMPTS]
    with ThreadPoolExecutor(6) as pool:
        pd = list(pool.map(lambda job: _gen(cluster[job[0]], job[1]), jobs))
    assert _stats(cluster["d1"])["extend_steps"] == 0  # every prompt's KV came from prefill
    assert _stats(cluster["d2"])["extend_steps"] == 0
    colocated = {p: _gen(cluster["d1"], p) for p in PROMPTS}  # no bootstrap: runs there, tp 1
    for (pair, prompt), got in zip(jobs, pd):
        assert got["output_ids"] == colocated[prompt]["output_ids"], pair
        assert got["meta_info"]["finish_reason"] == colocated[prompt]["meta_info"][
            "finish_reason"], pair
    for name in ("d1", "d2"):
        stats = _stats(cluster[name])
        assert stats["pd_kv_tokens_received"] > 0 and stats["pd_transfer_failures"] == 0, name
    assert _stats(cluster["d2"])["pd_kv_tokens_in_place"] > 0  # each rank's heads from one rank
    assert _stats(cluster["p2"])["pd_transfers_total"] == 2 * len(PROMPTS)
    for name in ("p1", "p2", "d1", "d2"):
        _idle(cluster[name])  # every rank's pools and transfers


def test_json_schema_through_a_tp2_prefill_server_is_valid(cluster):
    openai = pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    for pair in ("p2-d1", "p2-d2"):
        client = openai.OpenAI(base_url=f"{cluster[pair]}/v1", api_key="none", timeout=TIMEOUT)
        out = client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=48, temperature=0.0,
            messages=[{"role": "user", "content": "A person as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "p",
                                                                    "schema": schema}})
        jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    for name in ("p2", "d1", "d2"):
        _idle(cluster[name])


def test_killed_decode_server_frees_the_kv_on_every_prefill_rank(cluster):
    """Last: kills the TP=2 decode server while the TP=2 prefill server sends to it. The
    requests fail with a reason and no prefill rank keeps KV for them."""
    def long_request(i: int) -> httpx.Response:
        body = {"text": f"{PROMPTS[i % 4]} {i}", "stream": bool(i % 2),
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        return httpx.post(f"{cluster['p2-d2']}/generate", json=body, timeout=TIMEOUT)

    before = _stats(cluster["d2"])["pd_transfers_total"]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(long_request, i) for i in range(4)]
        deadline = time.monotonic() + 60
        while (_stats(cluster["d2"])["pd_transfers_total"] < before + 2
               and time.monotonic() < deadline):
            time.sleep(0.05)
        cluster["procs"]["d2"].kill()
        answers = [f.result() for f in futures]
    for r in answers:
        failed = r.status_code != 200 or '"error"' in r.text or '"abort"' in r.text
        assert failed, r.text[:300]
    _idle(cluster["p2"])  # both ranks: rank 0 answers for every rank
    assert _gen(cluster["p2-d1"], PROMPTS[0])["output_ids"]  # the prefill server still serves
    _idle(cluster["p2"])

"""Disaggregation with a tensor-parallel decode server (CPU, gloo): one prefill server at
tp_size 1 and one decode server at tp_size 2 (the tiny model's 2 kv heads: one per rank, so
each rank receives its own head's pages) behind a PD router on loopback. Greedy answers equal
the prefill server's own colocated answers (tp_size 1, same dummy weights) token for token,
with requests arriving together (their transfers land on the two ranks at different moments,
yet both ranks must let each request join in the same step), and both servers end idle."""
from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from sgdsl.runtime.router.app import create_app
from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.server.thread_server import ThreadServer
from processes import free_port, stop_tree, url_of

from .test_pd_real import PROMPTS, _gen, _idle, _stats

pytestmark = pytest.mark.slow


def _start(model_dir, mode: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sgdsl.runtime.launcher", "--model", str(model_dir),
           "--load-format", "dummy", "--num-threads", "1", "--max-total-tokens", "4096",
           "--host", "127.0.0.1", "--port", "0", "--grammar-backend", "none",
           "--disaggregation-mode", mode, "--disaggregation-timeout-s", "60", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def pair(tiny_model_dir) -> Iterator[dict]:
    port = free_port()
    procs = [_start(tiny_model_dir, "prefill", "--disaggregation-bootstrap-port", str(port)),
             _start(tiny_model_dir, "decode", "--tp-size", "2")]
    try:
        prefill, decode = (url_of(p) for p in procs)
        config = RouterConfig(pd_disaggregation=True, prefill_urls=(prefill,),
                              prefill_bootstrap_ports=(port,), decode_urls=(decode,),
                              health_interval_s=0.5, health_timeout_s=30.0, max_retries=0)
        router = ThreadServer(create_app(config))
        yield {"prefill": prefill, "decode": decode, "router": router.start()}
        router.stop()
    finally:
        for proc in procs:
            stop_tree(proc)


def test_tp2_decode_server_equals_colocated_token_for_token(pair):
    with ThreadPoolExecutor(4) as pool:
        pd = list(pool.map(lambda p: _gen(pair["router"], p), PROMPTS))
    colocated = [_gen(pair["prefill"], p) for p in PROMPTS]  # no bootstrap: runs there, tp 1
    for a, b in zip(pd, colocated):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
    stats = _stats(pair["decode"])
    assert stats["pd_kv_tokens_received"] > 0 and stats["pd_transfer_failures"] == 0
    assert stats["pd_kv_tokens_in_place"] > 0  # a fresh pool's slots: received in place
    assert stats["extend_steps"] == 0  # every prompt's KV came from the prefill server
    for name in ("prefill", "decode"):
        _idle(pair[name])  # every rank's pools and transfers

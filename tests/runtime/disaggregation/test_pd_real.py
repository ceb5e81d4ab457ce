"""Prefill/decode disaggregation end to end on loopback: two prefill servers and one decode
server (real ``sgdsl serve`` processes of the tiny random model) behind a PD router in this
process. The decode server also serves requests without bootstrap fields colocated, which is
the reference every disaggregated answer must equal token for token (same dummy weights: the
same seed). The last two tests kill a prefill server, then the decode server, mid-run."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import httpx
import pytest

from sgdsl.runtime.router.app import create_app
from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.server.thread_server import ThreadServer
from processes import free_port, stop_tree, url_of

pytestmark = pytest.mark.slow
TIMEOUT = 120.0  # generous: CI is a loaded 2-core box


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    bootstrap_port: int = 0


def _start(model_dir, mode: str, bootstrap_port: int = 0) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sgdsl.runtime.launcher", "--model", str(model_dir),
           "--load-format", "dummy", "--num-threads", "1", "--max-total-tokens", "4096",
           "--host", "127.0.0.1", "--port", "0", "--grammar-compile-workers", "1",
           "--disaggregation-mode", mode, "--disaggregation-timeout-s", "30"]
    if bootstrap_port:
        cmd += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir) -> Iterator[dict]:
    ports = [free_port(), free_port()]
    procs = {"p0": _start(tiny_model_dir, "prefill", ports[0]),
             "p1": _start(tiny_model_dir, "prefill", ports[1]),
             "d": _start(tiny_model_dir, "decode")}
    try:
        servers = {name: Server(url_of(p), p) for name, p in procs.items()}
        servers["p0"].bootstrap_port, servers["p1"].bootstrap_port = ports
        config = RouterConfig(pd_disaggregation=True, policy="round_robin",
                              prefill_urls=(servers["p0"].url, servers["p1"].url),
                              prefill_bootstrap_ports=tuple(ports),
                              decode_urls=(servers["d"].url,), health_interval_s=0.5,
                              health_timeout_s=30.0, max_retries=1)  # a slow box is not down
        router = ThreadServer(create_app(config))
        yield {**servers, "router": router.start()}
        router.stop()
    finally:
        for proc in procs.values():
            stop_tree(proc)


def _gen(url: str, text: str, **params) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": 16, "temperature": 0.0,
                                              **params.pop("sampling", {})}, **params}
    r = httpx.post(f"{url}/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def _idle(url: str) -> None:
    """The idle invariant, once the server has let go of everything (generous deadline)."""
    deadline, last = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        last = httpx.get(f"{url}/debug/check_idle_integrity", timeout=TIMEOUT)
        if last.status_code == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"{url} not idle: {last.text if last is not None else ''}")


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/get_server_info", timeout=TIMEOUT).json()


PROMPTS = ["The history of the river valley", "A short note about compilers and caches",
           "Once upon a time in a quiet harbor town", "List three colors:"]


def test_greedy_generate_equals_colocated_token_for_token(cluster):
    with ThreadPoolExecutor(4) as pool:
        pd = list(pool.map(lambda p: _gen(cluster["router"], p), PROMPTS))
    colocated = [_gen(cluster["d"].url, p) for p in PROMPTS]
    for a, b in zip(pd, colocated):
        assert a["output_ids"] == b["output_ids"]
        assert a["text"] == b["text"]
        assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
    served = [_stats(cluster[p].url)["pd_transfers_total"] for p in ("p0", "p1")]
    assert all(n >= 1 for n in served), served  # round robin: both prefill servers served
    assert _stats(cluster["d"].url)["pd_kv_tokens_received"] > 0
    for name in ("p0", "p1", "d"):
        _idle(cluster[name].url)


def test_logprobs_and_stop_strings_equal_colocated(cluster):
    kw = dict(return_logprob=True, top_logprobs_num=2, logprob_start_len=0)
    a, b = _gen(cluster["router"], PROMPTS[0], **kw), _gen(cluster["d"].url, PROMPTS[0], **kw)
    for field in ("input_token_logprobs", "output_token_logprobs", "output_top_logprobs"):
        got, want = a["meta_info"][field], b["meta_info"][field]
        assert len(got) == len(want) and got, field
        for x, y in zip(got, want):
            assert x[1] == y[1] if field != "output_top_logprobs" else True
            if field != "output_top_logprobs" and x[0] is not None:
                assert abs(x[0] - y[0]) < 1e-3, field
    # a stop string from the middle of the greedy output cuts both answers at the same place
    full = _gen(cluster["d"].url, PROMPTS[2], sampling={"max_new_tokens": 24})["text"]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    a = _gen(cluster["router"], PROMPTS[2], sampling={"max_new_tokens": 24, "stop": [stop]})
    b = _gen(cluster["d"].url, PROMPTS[2], sampling={"max_new_tokens": 24, "stop": [stop]})
    assert a["text"] == b["text"] and a["meta_info"]["finish_reason"]["type"] == "stop"


def test_streamed_openai_chat_equals_colocated(cluster):
    openai = pytest.importorskip("openai")
    messages = [{"role": "user", "content": "Tell me about the sea."}]

    def chat(base: str, stream: bool) -> str:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=TIMEOUT)
        kw = dict(model=client.models.list().data[0].id, messages=messages, max_tokens=20, temperature=0.0)
        if not stream:
            return client.chat.completions.create(**kw).choices[0].message.content
        parts = [c.choices[0].delta.content or "" for c in
                 client.chat.completions.create(stream=True, **kw) if c.choices]
        return "".join(parts)

    assert chat(cluster["router"], True) == chat(cluster["d"].url, False)


def test_json_schema_request_is_valid(cluster):
    openai = pytest.importorskip("openai")
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    client = openai.OpenAI(base_url=f"{cluster['router']}/v1", api_key="none", timeout=TIMEOUT)
    out = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": "A person as JSON."}],
        max_tokens=48, temperature=0.0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    for name in ("p0", "p1", "d"):
        _idle(cluster[name].url)


def test_anthropic_messages_stream_through_the_pair(cluster):
    model = httpx.get(f"{cluster['d'].url}/v1/models", timeout=TIMEOUT).json()["data"][0]["id"]
    body = {"model": model, "max_tokens": 12, "temperature": 0.0,
            "messages": [{"role": "user", "content": "Name a river."}]}
    with httpx.stream("POST", f"{cluster['router']}/v1/messages", json={**body, "stream": True},
                      timeout=TIMEOUT) as r:
        assert r.status_code == 200
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    streamed = "".join(e["delta"].get("text", "") for e in events
                       if e.get("type") == "content_block_delta")
    plain = httpx.post(f"{cluster['d'].url}/v1/messages", json=body, timeout=TIMEOUT).json()
    assert streamed == "".join(b["text"] for b in plain["content"] if b["type"] == "text")


def test_killed_prefill_server_requests_move_to_the_other_pair(cluster):
    """Kills one prefill server while requests are on it: nothing was streamed, so the router
    retries them on the other prefill server (the decode server frees what it held)."""
    router, victim = cluster["router"], cluster["p1"]
    before = _stats(victim.url)["requests_total"]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_gen, router, p, sampling={"max_new_tokens": 32})
                   for p in PROMPTS]
        deadline = time.monotonic() + 60
        while _stats(victim.url)["requests_total"] == before and time.monotonic() < deadline:
            time.sleep(0.02)
        victim.proc.kill()
        answers = [f.result() for f in futures]
    for prompt, got in zip(PROMPTS, answers):
        want = _gen(cluster["d"].url, prompt, sampling={"max_new_tokens": 32})
        assert got["output_ids"] == want["output_ids"]
    for name in ("p0", "d"):
        _idle(cluster[name].url)


def test_killed_decode_server_fails_requests_and_frees_the_prefill_side(cluster):
    """Last: kills the decode server. Requests in flight fail with a reason, none hangs, and
    neither prefill server keeps any KV for them."""
    router = cluster["router"]

    def long_request(i: int) -> httpx.Response:
        body = {"text": f"{PROMPTS[i % 4]} {i}", "stream": bool(i % 2),
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        return httpx.post(f"{router}/generate", json=body, timeout=TIMEOUT)

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(long_request, i) for i in range(6)]
        deadline = time.monotonic() + 60
        while _stats(cluster["d"].url)["pd_transfers_total"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster["d"].proc.kill()
        answers = [f.result() for f in futures]
    for r in answers:
        failed = r.status_code != 200 or '"error"' in r.text or '"abort"' in r.text
        assert failed, r.text[:300]
        assert "worker" in r.text or "decode" in r.text or "disaggregation" in r.text, r.text[:300]
    _idle(cluster["p0"].url)

"""Concurrency, disconnects and the idle invariant on the real server."""
from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from .conftest import API_KEY, Served


def _stats(served: Served) -> dict:
    with served.client() as client:
        return client.get("/get_server_info").json()


def _wait_kv_free(served: Served, timeout_s: float = 60.0) -> dict:
    """Poll until nothing runs and every KV slot is free or only held by the prefix cache."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = _stats(served)
        idle = s["num_running_reqs"] == 0 and s["num_waiting_reqs"] == 0
        if idle and s["kv_free_slots"] + s["kv_evictable_slots"] == s["kv_total_slots"]:
            return s
        assert time.monotonic() < deadline, f"KV not freed: {s}"
        time.sleep(0.05)


def _assert_idle_integrity(served: Served) -> None:
    with served.client() as client:
        resp = client.get("/debug/check_idle_integrity")
    assert resp.status_code == 200, resp.text


async def test_32_concurrent_clients(real_server: Served) -> None:
    client = openai.AsyncOpenAI(base_url=real_server.url + "/v1", api_key=API_KEY,
                                max_retries=0, timeout=600)

    async def one(i: int) -> str:
        if i % 2:
            out = await client.completions.create(model=real_server.model, prompt=f"{i} + {i} =",
                                                  max_tokens=3, temperature=0)
            return out.choices[0].text
        parts = []
        async for chunk in await client.chat.completions.create(
                model=real_server.model, max_tokens=3, temperature=0, stream=True,
                messages=[{"role": "user", "content": f"Count from {i}."}]):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)

    results = await asyncio.gather(*(one(i) for i in range(32)))
    await client.close()
    assert len(results) == 32 and all(results)
    _wait_kv_free(real_server)
    _assert_idle_integrity(real_server)


def test_stream_disconnect_frees_kv(real_server: Served) -> None:
    body = {"text": "Tell me a very long story.", "stream": True,
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    with real_server.client() as client:
        with client.stream("POST", "/generate", json=body) as resp:
            lines = resp.iter_lines()
            got = [line for line in (next(lines) for _ in range(6)) if line.startswith("data:")]
            assert got
            assert _stats(real_server)["num_running_reqs"] == 1
    after = _wait_kv_free(real_server)
    assert after["num_running_reqs"] == 0
    _assert_idle_integrity(real_server)


def test_plain_disconnect_frees_kv(real_server: Served) -> None:
    body = {"text": "Tell me another very long story.",
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    with real_server.client() as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/generate", json=body, timeout=3.0)
    _wait_kv_free(real_server)
    _assert_idle_integrity(real_server)


def test_metrics_after_traffic(real_server: Served) -> None:
    with real_server.client() as client:
        text = client.get("/metrics").text
    for name in ("sgdsl_time_to_first_token_seconds_bucket", "sgdsl_inter_token_latency_seconds",
                 "sgdsl_engine_num_waiting_reqs", "sgdsl_engine_cache_hit_rate",
                 "sgdsl_engine_num_running_reqs", "sgdsl_prompt_tokens_total"):
        assert name in text, name
    ttft = [l for l in text.splitlines() if l.startswith("sgdsl_time_to_first_token_seconds_count")]
    assert float(ttft[0].split()[-1]) >= 1

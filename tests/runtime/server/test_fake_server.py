"""Server behaviour that needs exact control over the engine, on a fake engine behind the real
app and a real uvicorn: disconnect aborts, abort by rid, API key, CORS."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from sgdsl.runtime.server.app import create_app
from sgdsl.runtime.server.args import ServerArgs

from .conftest import API_KEY, Served
from .fake_engine import FakeEngine


def _wait_idle(engine: FakeEngine, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.running, f"still running: {engine.running}"


def test_stream_disconnect_aborts(fake_server: Served) -> None:
    engine = fake_server.engine
    body = {"text": "abcdef", "stream": True, "rid": "disc-stream",
            "sampling_params": {"max_new_tokens": 500}}
    with fake_server.client() as client:
        with client.stream("POST", "/generate", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
            assert "disc-stream" in engine.running
    _wait_idle(engine)
    # aborted by the server, or its stream closed under it: either way it stopped early
    assert engine.finish_types["disc-stream"] in ("abort", "closed")


def test_nonstream_disconnect_aborts(fake_server: Served) -> None:
    engine = fake_server.engine
    body = {"text": "abcdef", "rid": "disc-plain", "sampling_params": {"max_new_tokens": 500}}
    with fake_server.client() as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/generate", json=body, timeout=0.3)
    _wait_idle(engine)
    assert engine.finish_types["disc-plain"] in ("abort", "closed")


def test_abort_request_by_rid(fake_server: Served) -> None:
    engine = fake_server.engine

    async def run() -> dict:
        async with httpx.AsyncClient(base_url=fake_server.url, timeout=30,
                                     headers={"x-api-key": API_KEY}) as client:
            gen = asyncio.ensure_future(client.post("/generate", json={
                "text": "xyz", "rid": "victim", "sampling_params": {"max_new_tokens": 500}}))
            while "victim" not in engine.running:
                await asyncio.sleep(0.01)
            resp = await client.post("/abort_request", json={"rid": "victim"})
            assert resp.status_code == 200
            return (await gen).json()

    out = asyncio.run(run())
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["completion_tokens"] < 500


@pytest.mark.parametrize("path", ["/v1/models", "/get_model_info", "/metrics"])
def test_api_key_required(fake_server: Served, path: str) -> None:
    assert httpx.get(fake_server.url + path).status_code == 401
    assert httpx.get(fake_server.url + path, headers={"x-api-key": "wrong"}).status_code == 401
    ok = httpx.get(fake_server.url + path, headers={"x-api-key": API_KEY})
    assert ok.status_code == 200


def test_health_is_open(fake_server: Served) -> None:
    assert httpx.get(fake_server.url + "/health").status_code == 200
    assert httpx.get(fake_server.url + "/health_generate").status_code == 200


def test_cors_off_by_default(fake_server: Served) -> None:
    resp = httpx.options(fake_server.url + "/v1/models", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in resp.headers


async def test_cors_on_when_asked() -> None:
    app = create_app(FakeEngine(), ServerArgs(cors_origins=("http://ok.example",)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        resp = await client.options("/v1/models", headers={
            "Origin": "http://ok.example", "Access-Control-Request-Method": "GET"})
        assert resp.headers.get("access-control-allow-origin") == "http://ok.example"
        resp = await client.get("/v1/models", headers={"Origin": "http://other.example"})
        assert "access-control-allow-origin" not in resp.headers


def test_metrics_count_requests_and_tokens(fake_server: Served) -> None:
    with fake_server.client() as client:
        out = client.post("/generate", json={"text": "hello", "stream": True,
                                             "sampling_params": {"max_new_tokens": 3}})
        assert out.status_code == 200
        text = client.get("/metrics").text
    assert 'sgdsl_http_requests_total{route="/generate",status="200"}' in text
    assert "sgdsl_time_to_first_token_seconds_count" in text
    count = [l for l in text.splitlines() if l.startswith("sgdsl_generation_tokens_total")]
    assert count and float(count[0].split()[-1]) >= 3
    assert "sgdsl_engine_num_running_reqs" in text


def test_abort_all(fake_server: Served) -> None:
    engine = fake_server.engine

    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=fake_server.url, timeout=30,
                                     headers={"x-api-key": API_KEY}) as client:
            gens = [asyncio.ensure_future(client.post("/generate", json={
                "text": "xyz", "sampling_params": {"max_new_tokens": 500}})) for _ in range(3)]
            while len(engine.running) < 3:
                await asyncio.sleep(0.01)
            resp = await client.post("/abort_request", json={"abort_all": True})
            assert resp.status_code == 200
            return [(await g).json() for g in gens]

    outs = asyncio.run(run())
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort"] * 3


async def test_oversized_body_is_413_in_protocol_shape() -> None:
    app = create_app(FakeEngine(), ServerArgs(max_body_bytes=200))
    transport = httpx.ASGITransport(app=app)
    big = {"model": "fake-model", "prompt": "x" * 500}
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        resp = await client.post("/v1/completions", json=big)
        assert resp.status_code == 413 and resp.json()["error"]["message"]
        resp = await client.post("/v1/messages", json={**big, "max_tokens": 1})
        assert resp.status_code == 413
        assert resp.json()["error"]["type"] == "request_too_large"

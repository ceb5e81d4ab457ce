"""The router's proxy against in-thread workers: scripted ones (failures on cue) and the real
server app over the fake engine (protocol shapes, RuntimeEndpoint)."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Iterator

import httpx
import pytest

from sgdsl.runtime.router.app import create_app
from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.server.thread_server import ThreadServer

from .flaky_worker import Script, make_app

HERE = os.path.dirname(__file__)
FAST = dict(backoff_base_s=0.01, backoff_max_s=0.02, health_interval_s=0.2,
            health_timeout_s=1.0, read_timeout_s=2.0)


class Pool:
    """Scripted workers and a router in front of them, all served in threads."""

    def __init__(self, n: int, **router_kw) -> None:
        self.scripts = [Script(name=chr(ord("a") + i)) for i in range(n)]
        self.servers = [ThreadServer(make_app(s)) for s in self.scripts]
        self.urls = [s.start() for s in self.servers]
        config = RouterConfig(worker_urls=tuple(self.urls), **{**FAST, **router_kw})
        self.router = ThreadServer(create_app(config))
        self.url = self.router.start()
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def close(self) -> None:
        self.client.close()
        self.router.stop()
        for s in self.servers:
            s.stop()

    def workers(self) -> list[dict]:
        return self.client.get("/list_workers").json()["workers"]


@pytest.fixture
def pool2() -> Iterator[Pool]:
    pool = Pool(2, policy="round_robin")
    yield pool
    pool.close()


def gen(client: httpx.Client, stream: bool = False, path: str = "/generate") -> httpx.Response:
    return client.post(path, json={"text": "hello", "stream": stream})


def sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_retry_on_another_worker_before_the_first_byte(pool2):
    pool2.scripts[0].mode = "drop"
    for _ in range(4):  # round robin keeps offering the broken worker first half of the time
        r = gen(pool2.client)
        assert r.status_code == 200 and r.json()["text"] == "b"
        s = gen(pool2.client, stream=True)
        assert s.status_code == 200 and sse_data(s.text)[-1] == "[DONE]"
    pool2.scripts[1].mode = "503"
    r = gen(pool2.client)
    assert r.status_code == 503
    assert "no worker could serve the request" in r.json()["error"]["message"]
    metrics = pool2.client.get("/metrics").text
    assert 'sgdsl_router_retries_total{route="/generate"}' in metrics
    for kind in ("read", "stream_start", "status_503"):
        assert f'kind="{kind}"' in metrics


def test_worker_dying_mid_stream_ends_with_an_error_event(pool2):
    pool2.scripts[0].mode = pool2.scripts[1].mode = "die_mid_stream"
    s = gen(pool2.client, stream=True)
    data = sse_data(s.text)
    assert json.loads(data[0])["index"] == 0
    err = json.loads(data[-2])["error"]
    assert err["code"] == 502 and "after the stream started" in err["message"]
    assert data[-1] == "[DONE]"
    a = pool2.client.post("/v1/messages", json={"messages": [], "stream": True})
    assert "event: error" in a.text
    err = json.loads(sse_data(a.text)[-1])
    assert err["type"] == "error" and err["error"]["type"] == "api_error"


def test_a_hung_worker_times_out_and_the_request_moves_on():
    pool = Pool(2, policy="round_robin", read_timeout_s=0.5)
    try:
        pool.scripts[0].mode = "hang"
        # Without the read timeout this would wait for the client's own 30 s timeout and fail.
        results = [gen(pool.client).json()["text"] for _ in range(2)]
        assert results == ["b", "b"]
    finally:
        pool.scripts[0].mode = "ok"
        pool.close()


def test_circuit_breaker_opens_and_recovers():
    pool = Pool(2, policy="round_robin", breaker_failure_threshold=2, breaker_cooldown_s=0.5,
                breaker_success_threshold=1)
    try:
        pool.scripts[0].mode = "503"
        for _ in range(4):
            assert gen(pool.client).json()["text"] == "b"
        assert pool.workers()[0]["circuit"] == "open"
        seen_b = len(pool.scripts[1].seen)
        for _ in range(3):  # open: every request goes to b without trying a first
            gen(pool.client)
        assert len(pool.scripts[1].seen) == seen_b + 3
        pool.scripts[0].mode = "ok"
        time.sleep(0.6)  # cooldown over: a trial request closes it again
        texts = {gen(pool.client).json()["text"] for _ in range(4)}
        assert texts == {"a", "b"} and pool.workers()[0]["circuit"] == "closed"
    finally:
        pool.close()


def test_health_checks_take_a_worker_out_and_back(pool2):
    pool2.scripts[1].healthy = False
    deadline = time.monotonic() + 10
    while pool2.workers()[1]["healthy"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [gen(pool2.client).json()["text"] for _ in range(4)] == ["a"] * 4
    pool2.scripts[1].healthy = True
    while not pool2.workers()[1]["healthy"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {gen(pool2.client).json()["text"] for _ in range(4)} == {"a", "b"}
    pool2.scripts[0].healthy = pool2.scripts[1].healthy = False
    while pool2.client.get("/health").status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool2.client.get("/health").status_code == 503


def test_add_and_remove_workers_at_run_time(pool2):
    extra = Script(name="c")
    server = ThreadServer(make_app(extra))
    url = server.start()
    try:
        r = pool2.client.post("/add_worker", params={"url": url})
        assert r.status_code == 200 and r.json()["added"] == url
        assert {gen(pool2.client).json()["text"] for _ in range(6)} == {"a", "b", "c"}
        r = pool2.client.post("/remove_worker", json={"url": pool2.urls[0]})
        assert r.status_code == 200
        assert {gen(pool2.client).json()["text"] for _ in range(6)} == {"b", "c"}
        assert [w["url"] for w in pool2.workers()] == [pool2.urls[1], url]
    finally:
        server.stop()


@pytest.mark.parametrize("call, status, field, words", [
    (("post", "/add_worker", {"params": {"url": "ftp://x:1"}}), 400, "url", "invalid worker URL"),
    (("post", "/add_worker", {"json": {}}), 400, "url", "required"),
    (("post", "/add_worker", {"params": {"url": "http://127.0.0.1:9"}}), 400, "url",
     "health check"),
    (("post", "/remove_worker", {"params": {"url": "http://127.0.0.1:9"}}), 400, "url",
     "no worker"),
    (("post", "/generate", {"content": b"[1, 2"}), 400, None, "malformed JSON"),
    (("post", "/v1/chat/completions", {"json": [1]}), 400, None, "JSON object"),
    (("get", "/v1/nothing", {}), 404, None, "Not Found"),
    (("get", "/generate", {}), 405, None, "Method Not Allowed"),
])
def test_bad_input_gets_a_clear_error(pool2, call, status, field, words):
    method, path, kw = call
    r = getattr(pool2.client, method)(path, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"] and err.get("param") == field


def test_flush_is_broadcast_and_info_comes_from_any_worker(pool2):
    assert pool2.client.post("/flush_cache").text == "Cache flushed."
    assert [s.flushed for s in pool2.scripts] == [1, 1]
    assert pool2.client.get("/get_model_info").json()["model_path"] == "/flaky"


def test_precompile_is_broadcast_and_merged(pool2):
    """Every worker compiles; a constraint is ok only if ok on every worker, else the first
    worker's error is its result."""
    pool2.scripts[1].precompile_fails = (1,)
    body = {"constraints": [{"regex": "a"}, {"regex": "b"}, {"regex": "c"}]}
    r = pool2.client.post("/precompile", json=body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["ok"] for x in results] == [True, False, True] and r.json()["workers"] == 2
    assert results[1]["error"] == "b rejects it"
    assert all({"precompile": body["constraints"]} in s.seen for s in pool2.scripts)


def test_api_key_and_metrics_per_worker_and_policy():
    pool = Pool(2, policy="power_of_two", api_key="sekret", max_body_bytes=1000)
    try:
        assert gen(pool.client).status_code == 401
        assert pool.client.get("/health").status_code == 200  # open, as on the server
        auth = {"Authorization": "Bearer sekret"}
        assert pool.client.post("/generate", json={"text": "x"}, headers=auth).status_code == 200
        big = pool.client.post("/v1/messages", json={"text": "x" * 2000}, headers=auth)
        assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
        metrics = pool.client.get("/metrics", headers=auth).text
        assert 'sgdsl_router_policy_decisions_total{policy="power_of_two"' in metrics
        for url in pool.urls:
            assert f'sgdsl_router_worker_healthy{{worker="{url}"}} 1.0' in metrics
    finally:
        pool.close()


@pytest.fixture(scope="module")
def fake_engines() -> Iterator[tuple[str, list, list]]:
    """Two real server apps over the fake engine, behind a cache_aware router."""
    sys.path.insert(0, os.path.join(HERE, "..", "server"))
    from fake_engine import FakeEngine

    from sgdsl.runtime.server.app import create_app as server_app

    engines = [FakeEngine(step_s=0.001) for _ in range(2)]
    servers = [ThreadServer(server_app(e)) for e in engines]
    urls = [s.start() for s in servers]
    router = ThreadServer(create_app(RouterConfig(worker_urls=tuple(urls), **FAST)))
    yield router.start(), urls, engines
    router.stop()
    for s in servers:
        s.stop()


def test_openai_and_anthropic_routes_through_the_router(fake_engines):
    url, workers, _ = fake_engines
    with httpx.Client(base_url=url, timeout=30) as c:
        chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3}
        assert c.post("/v1/chat/completions", json=chat).json()["object"] == "chat.completion"
        s = c.post("/v1/chat/completions", json={**chat, "stream": True})
        assert sse_data(s.text)[-1] == "[DONE]"
        assert c.get("/v1/models").json()["data"][0]["id"] == "fake-model"
        msg = {"model": "fake-model", "max_tokens": 3,
               "messages": [{"role": "user", "content": "hi"}]}
        assert c.post("/v1/messages", json=msg).json()["type"] == "message"
        bad = c.post("/v1/chat/completions", json={**chat, "max_tokens": -1})
        assert bad.status_code == 400  # the worker's own validation error passes through


def test_runtime_endpoint_works_against_the_router_unchanged(fake_engines):
    import sgdsl as sgl
    from sgdsl.backends.runtime_endpoint import RuntimeEndpoint

    url, _, _ = fake_engines

    @sgl.function
    def prog(s):
        s += "Say: " + sgl.gen("x", max_tokens=5)

    backend = RuntimeEndpoint(url)
    assert backend.model_info["served_model_name"] == "fake-model"
    assert prog.run(backend=backend)["x"] == " :yaS"
    state = prog.run(backend=backend, stream=True)
    assert "".join(state.text_iter()).endswith(" :yaS")
    assert backend.flush_cache() is True


def test_requests_on_a_worker_found_down_fail_over_before_the_read_timeout():
    from concurrent.futures import ThreadPoolExecutor

    pool = Pool(2, policy="round_robin", read_timeout_s=600, health_interval_s=0.1,
                health_failure_threshold=1)
    try:
        pool.scripts[0].mode = "hang"
        with ThreadPoolExecutor(2) as ex:
            plain = ex.submit(gen, pool.client)  # round robin: the first goes to a
            deadline = time.monotonic() + 10
            while pool.workers()[0]["load"] == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert pool.workers()[0]["load"] == 1  # waiting on the hung worker
            pool.scripts[0].healthy = False  # now its health checks fail
            # Cut off once a is found down; without that it would wait for the 600 s read
            # timeout, past the client's own 30 s.
            assert plain.result().json()["text"] == "b"
        assert pool.workers()[0]["load"] == 0 and not pool.workers()[0]["healthy"]
        # A stream that already sent output is cut off with an error event, not left hanging.
        pool.scripts[0].mode, pool.scripts[0].healthy = "stall_mid_stream", True
        while not pool.workers()[0]["healthy"] and time.monotonic() < deadline + 10:
            time.sleep(0.02)
        with ThreadPoolExecutor(2) as ex:
            # Round robin over two available workers: one of the two streams lands on a.
            streams = [ex.submit(gen, pool.client, True) for _ in range(2)]
            while pool.workers()[0]["load"] == 0 and time.monotonic() < deadline + 20:
                time.sleep(0.02)
            pool.scripts[0].healthy = False
            texts = [f.result().text for f in streams]
        broken = [t for t in texts if '"error"' in t]
        assert len(broken) == 1 and "after the stream started" in broken[0]
    finally:
        pool.scripts[0].mode = "ok"
        pool.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_aborts_the_request_on_the_worker(fake_engines, stream):
    url, _, engines = fake_engines
    rid = f"leaver-{stream}"
    body = {"text": "hi", "rid": rid, "stream": stream,
            "sampling_params": {"max_new_tokens": 400}}  # 400 steps of 20 ms: 8 s if not cut
    for e in engines:
        e.step_s = 0.02
    try:
        with httpx.Client(base_url=url, timeout=0.5) as c:
            if stream:
                with c.stream("POST", "/generate", json=body) as r:
                    next(r.iter_lines())  # one event, then leave
            else:
                with pytest.raises(httpx.ReadTimeout):
                    c.post("/generate", json=body)
        deadline = time.monotonic() + 30
        while not any(rid in e.finish_types for e in engines) and time.monotonic() < deadline:
            time.sleep(0.05)
        finish = [e.finish_types[rid] for e in engines if rid in e.finish_types]
        assert finish and finish[0] != "length", finish
    finally:
        for e in engines:
            e.step_s = 0.001


@pytest.mark.parametrize("policy", ["prefix_hash", "cache_aware"])
def test_prefix_policies_keep_each_group_on_one_worker(policy):
    pool = Pool(3, policy=policy, prefix_chars=16)
    try:
        for q in range(4):
            for g in range(6):
                text = f"group-{g:02d} system prompt shared by the group; question {q}"
                assert pool.client.post("/generate", json={"text": text}).status_code == 200
        homes = {}
        for script in pool.scripts:
            for body in script.seen:
                homes.setdefault(body["text"][:8], set()).add(script.name)
        assert len(homes) == 6 and all(len(h) == 1 for h in homes.values())
        assert len(set.union(*homes.values())) > 1  # groups spread over the workers
    finally:
        pool.close()

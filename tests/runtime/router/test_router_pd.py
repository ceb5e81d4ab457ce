"""The router's PD mode against scripted workers (in threads, no engine): the prefill worker is
chosen by the policy (cache-aware: a prompt group stays on one prefill worker), the decode
worker is the least loaded, and both halves carry the same bootstrap (the chosen prefill
worker's host and bootstrap port, one room); the prefill half never streams."""
from __future__ import annotations

import threading
import time
from typing import Iterator

import httpx
import pytest

from sgdsl.runtime.router.app import create_app
from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.server.thread_server import ThreadServer

from .flaky_worker import Script, make_app
from .test_router_proxy import FAST

PORTS = (9101, 9102)  # bootstrap ports as configured (nothing listens: the workers are scripted)


class PDPool:
    def __init__(self, policy: str) -> None:
        self.prefill = [Script(name=n) for n in ("p", "q")]
        self.decode = [Script(name=n) for n in ("d", "e")]
        self.servers = [ThreadServer(make_app(s)) for s in self.prefill + self.decode]
        urls = self.urls = [s.start() for s in self.servers]
        config = RouterConfig(pd_disaggregation=True, prefill_urls=tuple(urls[:2]),
                              prefill_bootstrap_ports=PORTS, decode_urls=tuple(urls[2:]),
                              policy=policy, prefix_chars=16, **FAST)
        self.router = ThreadServer(create_app(config))
        self.client = httpx.Client(base_url=self.router.start(), timeout=30)

    def close(self) -> None:
        self.client.close()
        self.router.stop()
        for s in self.servers:
            s.stop()


@pytest.fixture
def pd_pool() -> Iterator[PDPool]:
    pool = PDPool("cache_aware")
    yield pool
    pool.close()


def _rooms(scripts: list[Script]) -> dict[int, tuple[str, dict]]:
    return {b["bootstrap_room"]: (s.name, b) for s in scripts for b in s.seen}


def test_cache_aware_prefill_and_one_bootstrap_per_pair(pd_pool):
    for q in range(3):
        for g in range(6):
            text = f"group-{g:02d} system prompt shared by the group; question {q}"
            r = pd_pool.client.post("/generate", json={"text": text, "stream": q == 1})
            assert r.status_code == 200, r.text
    prefill, decode = _rooms(pd_pool.prefill), _rooms(pd_pool.decode)
    assert len(prefill) == 18 and prefill.keys() == decode.keys()  # every request, both halves
    homes: dict[str, set] = {}
    for room, (name, body) in prefill.items():
        assert body["stream"] is False  # the prefill half never streams
        assert body["bootstrap_port"] == PORTS[name == "q"]  # its own worker's port
        assert body["bootstrap_host"] == "127.0.0.1"
        d_body = decode[room][1]
        assert (d_body["bootstrap_port"], d_body["bootstrap_host"]) == (
            body["bootstrap_port"], body["bootstrap_host"])
        assert d_body["text"] == body["text"]
        homes.setdefault(body["text"][:8], set()).add(name)
    assert len(homes) == 6 and all(len(h) == 1 for h in homes.values())  # cache-aware
    assert len(set.union(*homes.values())) == 2  # groups spread over both prefill workers


def _load(pool: PDPool, url: str) -> int:
    workers = pool.client.get("/list_workers").json()["workers"]
    return next(w["load"] for w in workers if w["url"] == url)


def test_decode_worker_is_the_least_loaded(pd_pool):
    busy = pd_pool.decode[0]
    busy.mode = "hang"  # "d" holds its first request
    held = threading.Thread(target=pd_pool.client.post, args=("/generate",),
                            kwargs={"json": {"text": "first"}})
    held.start()
    try:
        deadline = time.monotonic() + 30
        while _load(pd_pool, pd_pool.urls[2]) == 0:  # its decode half is at "d", hanging
            assert time.monotonic() < deadline, "the first request never reached a decode"
            time.sleep(0.02)
        for i in range(3):  # "d" has one in flight: the others go to "e"
            r = pd_pool.client.post("/generate", json={"text": f"next {i}"})
            assert r.status_code == 200 and r.json()["text"] == "e", r.text
    finally:
        busy.mode = "ok"
        held.join(30)
    assert [b["text"] for b in busy.seen] == ["first"]

"""A new JSON schema's checks (the meta-schema in jsonschema: up to ~0.3 s for a large schema)
run off the server's event loop (runtime/tokenizer/check_pool.py): while one request's schema
is being checked, the same server parses and answers the others. The check is made slow
deterministically: it waits for the test's gate (the tiny random model, the session's Engine
behind an app served on loopback in this process)."""
from __future__ import annotations

import asyncio
import json
import threading
import uuid
from typing import Any, Iterator

import httpx
import pytest

from sgdsl.runtime.grammar.compile import limits
from sgdsl.runtime.server.app import create_app
from sgdsl.runtime.server.thread_server import ThreadServer

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
WAIT_S = 60.0  # generous: a plain tiny-model request takes milliseconds


@pytest.fixture(scope="module")
def served(tiny_engine) -> Iterator[tuple[str, Any]]:
    server = ThreadServer(create_app(tiny_engine))
    url = server.start()
    yield url, tiny_engine
    server.stop()


class GatedCheck:
    """The meta-schema check, held at a gate: where it ran, and how often."""

    def __init__(self) -> None:
        self.real = limits._check_meta_schema
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.threads: list[str] = []

    def __call__(self, key: Any, schema: Any) -> None:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.gate.wait(WAIT_S)
        self.real(key, schema)


@pytest.fixture
def gated(monkeypatch) -> Iterator[GatedCheck]:
    check = GatedCheck()
    monkeypatch.setattr(limits, "_check_meta_schema", check)
    yield check
    check.gate.set()  # never leave a request (or the old code's loop) waiting


def _schema(**extra: Any) -> dict[str, Any]:
    """A schema no earlier test sent (the builder remembers checked schemas)."""
    return {"type": "object", "title": uuid.uuid4().hex,
            "properties": {"a": {"type": "integer"}}, **extra}


def _native(n: int, **extra: Any) -> dict[str, Any]:
    return {"input_ids": PROMPT, "sampling_params": {
        "max_new_tokens": n, "temperature": 0.0, "ignore_eos": True, **extra}}


def test_others_are_answered_while_a_new_schema_is_checked(served, gated):
    url, engine = served
    with httpx.Client(base_url=url, timeout=WAIT_S * 2) as client:
        slow: dict[str, httpx.Response] = {}
        worker = threading.Thread(target=lambda: slow.update(r=client.post(
            "/generate", json=_native(4, json_schema=json.dumps(_schema())))))
        worker.start()
        assert gated.entered.wait(WAIT_S), "the schema's check never started"
        # the loop is free: a plain request and a chat turn are answered before the check ends
        plain = client.post("/generate", json=_native(3), timeout=WAIT_S / 2)
        chat = client.post("/v1/chat/completions", timeout=WAIT_S / 2, json={
            "model": "default", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2, "ignore_eos": True})
        assert not gated.gate.is_set() and "r" not in slow
        assert plain.status_code == 200 and len(plain.json()["output_ids"]) == 3
        assert chat.status_code == 200, chat.text
        gated.gate.set()
        worker.join(WAIT_S)
    assert slow["r"].status_code == 200, slow["r"].text
    assert gated.threads and all(t.startswith("sgdsl-schema-check") for t in gated.threads)
    engine.check_idle_integrity()


def test_a_bad_schema_checked_off_the_loop_is_a_400_naming_the_field(served, gated):
    url, engine = served
    gated.gate.set()
    bad = _schema(properties={"a": {"type": 5}})
    with httpx.Client(base_url=url, timeout=WAIT_S) as client:
        native = client.post("/generate", json=_native(4, json_schema=bad))
        stream = client.post("/generate", json={**_native(4, json_schema=bad), "stream": True})
        chat = client.post("/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": _schema(properties={"b": {"type": 7}})}}})
    for resp in (native, stream, chat):
        assert resp.status_code == 400, resp.text
        assert "not a valid JSON Schema" in resp.text and "'type'" in resp.text
    assert chat.json()["error"]["param"] in ("response_format", "json_schema")
    assert len(gated.threads) == 2  # the native pair shared one check (the memo)
    engine.check_idle_integrity()


def test_a_burst_sharing_a_new_schema_checks_it_once_and_a_known_one_not_at_all(served, gated):
    url, engine = served
    schema = json.dumps(_schema())
    before = engine.stats()["offloop_schema_checks"]

    async def burst(n: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S * 2) as client:
            # one (schema, max_new_tokens) pair: the builder's memo key
            return await asyncio.gather(*(client.post("/generate", json=_native(
                3, json_schema=schema)) for _ in range(n)))
    gated.gate.set()
    first = asyncio.run(burst(6))
    assert [r.status_code for r in first] == [200] * 6
    assert len(gated.threads) == 1
    checked = engine.stats()["offloop_schema_checks"]
    assert 1 <= checked - before <= 6  # (several only where a request came after its check)
    again = asyncio.run(burst(3))  # remembered: built on the loop, no thread hop
    assert [r.status_code for r in again] == [200] * 3
    assert engine.stats()["offloop_schema_checks"] == checked and len(gated.threads) == 1
    engine.check_idle_integrity()


def test_a_flood_of_new_schemas_past_the_bound_gets_a_retryable_503(served, gated, monkeypatch):
    """Hostile input: with the check queue at its bound, another new schema is refused with
    503 + Retry-After (never a 400), a request with a known schema or none is still served."""
    url, engine = served
    monkeypatch.setattr(engine._checks, "max_queued", 1)
    known = json.dumps(_schema())
    gated.gate.set()
    with httpx.Client(base_url=url, timeout=WAIT_S * 2) as client:
        assert client.post("/generate", json=_native(3, json_schema=known)).status_code == 200
        gated.gate.clear()
        gated.entered.clear()  # the known schema's check entered it: wait for the next one
        slow: dict[str, httpx.Response] = {}
        worker = threading.Thread(target=lambda: slow.update(r=client.post(
            "/generate", json=_native(3, json_schema=json.dumps(_schema())))))
        worker.start()
        assert gated.entered.wait(WAIT_S)
        before = engine.stats()["offloop_schema_checks_rejected"]
        flood = client.post("/generate", json=_native(3, json_schema=json.dumps(_schema())))
        chat = client.post("/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2, "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": _schema()}}})
        served_meanwhile = [client.post("/generate", json=_native(3, json_schema=known)),
                            client.post("/generate", json=_native(2))]
        assert not gated.gate.is_set()
        gated.gate.set()
        worker.join(WAIT_S)
    for resp in (flood, chat):
        assert resp.status_code == 503, resp.text
        assert int(resp.headers["retry-after"]) >= 1 and "retry later" in resp.text
    assert chat.json()["error"]["type"] != "invalid_request_error"
    assert [r.status_code for r in served_meanwhile] == [200, 200]
    assert slow["r"].status_code == 200, slow["r"].text
    assert engine.stats()["offloop_schema_checks_rejected"] - before == 2
    engine.check_idle_integrity()


def test_an_abort_while_its_schema_is_checked_aborts_the_request(served, gated):
    """``/abort_request`` by rid during the check: the request is sent, then aborted (before,
    the abort found nothing to abort and the request ran to its end)."""
    url, engine = served
    rid = uuid.uuid4().hex
    with httpx.Client(base_url=url, timeout=WAIT_S * 2) as client:
        slow: dict[str, httpx.Response] = {}
        body = {**_native(400, json_schema=json.dumps(_schema())), "rid": rid}
        worker = threading.Thread(target=lambda: slow.update(r=client.post("/generate",
                                                                           json=body)))
        worker.start()
        assert gated.entered.wait(WAIT_S)
        assert client.post("/abort_request", json={"rid": rid}).status_code == 200
        gated.gate.set()
        worker.join(WAIT_S)
    out = slow["r"].json()
    assert out["meta_info"]["finish_reason"]["type"] == "abort", out
    assert len(out["output_ids"]) < 400
    engine.check_idle_integrity()

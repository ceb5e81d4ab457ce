"""``HotRoutes`` (the lean path of the hot POST routes) answers exactly as the FastAPI routes
do: the same app with and without it, the same bodies (valid, malformed, invalid fields,
odd content types, streamed), the same status, headers that matter and body (ids and
timestamps aside). Fake engine, in-process ASGI transport: no model, no sockets."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from fake_engine import FakeEngine  # noqa: E402

from sgdsl.runtime.server.app import create_app  # noqa: E402
from sgdsl.runtime.server.args import ServerArgs  # noqa: E402
from sgdsl.runtime.server.hot_routes import HotRoutes  # noqa: E402

CHAT = "/v1/chat/completions"
MSG = {"role": "user", "content": "hello"}
# Bodies the lean path serves itself: (path, body).
VALID: list[tuple[str, Any]] = [
    (CHAT, {"model": "fake-model", "messages": [MSG], "max_tokens": 5}),
    (CHAT, {"messages": [MSG], "max_tokens": 3, "temperature": 0, "seed": 1, "n": 2}),
    (CHAT, {"messages": [MSG], "max_tokens": 4, "logprobs": True, "top_logprobs": 2}),
    (CHAT, {"messages": [MSG], "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}),
    (CHAT, {"messages": [MSG], "max_tokens": 4, "response_format": {"type": "json_object"}}),
    ("/v1/completions", {"prompt": "abc", "max_tokens": 3, "echo": True, "logprobs": 1}),
    ("/v1/completions", {"prompt": [[1, 2], [3, 4]], "max_tokens": 2}),
    ("/generate", {"text": "abc", "sampling_params": {"max_new_tokens": 3}}),
    ("/generate", {"input_ids": [[5, 6], [7]], "sampling_params": {"max_new_tokens": 2}}),
    ("/generate", {"text": "abc", "sampling_params": {"max_new_tokens": 2}, "stream": True}),
    ("/v1/messages", {"model": "fake-model", "max_tokens": 4, "messages": [MSG]}),
    ("/v1/messages", {"model": "fake-model", "max_tokens": 4, "messages": [MSG],
                      "stream": True}),
]
# Everything else: (path, raw body or JSON-able, content type or None for application/json).
CASES: list[tuple[str, Any, str | None]] = [(p, b, None) for p, b in VALID] + [
    (CHAT, {"messages": [], "max_tokens": 5}, None),  # min_length
    (CHAT, {"messages": [MSG], "max_tokens": -1}, None),  # ge=0
    (CHAT, {"messages": [MSG], "bogus": 1}, None),  # extra forbidden
    (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, None),  # literal
    (CHAT, {"messages": [MSG], "model": "other"}, None),  # 404 from the handler
    (CHAT, {"messages": [MSG], "logit_bias": {"1": 2.0}}, None),  # 400 from the handler
    (CHAT, {"messages": [MSG], "temperature": -3}, None),
    (CHAT, {"messages": [MSG], "max_tokens": 5000}, None),  # past the context
    (CHAT, b'{"messages": [', None),  # malformed JSON
    (CHAT, b"", None),  # empty body
    (CHAT, b"[1, 2]", None),  # not an object
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800"}], "max_tokens": 2}', None),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "seed": NaN}', None),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "seed": 1e999}', None),
    (CHAT, json.dumps({"messages": [MSG], "max_tokens": 2}).encode("utf-16"), None),
    (CHAT, json.dumps({"messages": [MSG], "max_tokens": 2}), "text/plain"),
    (CHAT, json.dumps({"messages": [MSG], "max_tokens": 2}),
     "application/x-www-form-urlencoded"),
    (CHAT, json.dumps({"messages": [MSG], "max_tokens": 2}), "application/vnd.api+json"),
    ("/v1/completions", {"prompt": [], "max_tokens": 2}, None),
    ("/v1/completions", {"prompt": "abc", "suffix": "x"}, None),
    ("/v1/completions", {"max_tokens": 2}, None),  # prompt missing
    ("/generate", {"text": "abc", "input_ids": [1]}, None),
    ("/generate", {"text": "abc", "sampling_params": {"max_new_tokens": 3, "top_p": 7}}, None),
    ("/generate", {"text": 5}, None),
    ("/generate", {"input_ids": [2 ** 70]}, None),  # past 64 bits: orjson refuses it
    ("/v1/messages", {"model": "fake-model", "messages": [MSG]}, None),  # max_tokens missing
    ("/v1/messages", {"model": "fake-model", "max_tokens": 4, "messages": [MSG],
                      "stop_sequences": "x"}, None),
]
VOLATILE = {"id", "created", "rid", "e2e_latency", "response_sent_to_client_ts"}


def _strip(value: Any) -> Any:
    """The body with per-request ids and timings removed."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _content(resp: httpx.Response) -> Any:
    kind = resp.headers.get("content-type", "")
    if kind.startswith("application/json"):
        return _strip(resp.json())
    if kind.startswith("text/event-stream"):
        events = []
        for line in resp.text.splitlines():
            data = line[6:] if line.startswith("data: ") else None
            events.append(line if data in (None, "[DONE]") else _strip(json.loads(data)))
        return events
    return resp.text


def _apps() -> tuple[Any, Any]:
    lean = create_app(FakeEngine(step_s=0.0), ServerArgs())
    plain = create_app(FakeEngine(step_s=0.0), ServerArgs())
    plain.user_middleware = [m for m in plain.user_middleware if m.cls is not HotRoutes]
    plain.front = None  # app.ServerApp: the hot routes in front of FastAPI's stack
    assert any(m.cls is HotRoutes for m in lean.user_middleware) and lean.front is not None
    return lean, plain


async def _post(app: Any, path: str, body: Any, kind: str | None) -> httpx.Response:
    content = body if isinstance(body, bytes) else (
        body.encode() if isinstance(body, str) else json.dumps(body).encode())
    headers = {"content-type": kind or "application/json"}
    # NOTE: an internal error (500) is answered, then re-raised to the server, as uvicorn
    # logs it; the transport must not raise it here, for both apps alike.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post(path, content=content, headers=headers)


@pytest.mark.parametrize("path,body,kind", CASES)
async def test_same_answer_with_and_without_the_lean_path(path: str, body: Any,
                                                          kind: str | None) -> None:
    lean, plain = _apps()
    got, want = await _post(lean, path, body, kind), await _post(plain, path, body, kind)
    assert got.status_code == want.status_code, (got.text, want.text)
    assert got.headers.get("content-type") == want.headers.get("content-type")
    assert got.headers.get("retry-after") == want.headers.get("retry-after")
    assert _content(got) == _content(want)


async def test_metrics_and_api_key_still_apply() -> None:
    app = create_app(FakeEngine(step_s=0.0), ServerArgs(api_key="k"))
    body = {"messages": [MSG], "max_tokens": 2}
    resp = await _post(app, CHAT, body, None)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                 headers={"x-api-key": "k"}) as client:
        assert (await client.post(CHAT, json=body)).status_code == 200
        text = (await client.get("/metrics")).text
    assert 'route="/v1/chat/completions",status="200"' in text.replace(" ", "")


async def test_valid_bodies_never_reach_fastapi() -> None:
    """The lean path serves a valid body itself (the app behind it is not called)."""
    from sgdsl.runtime.server.app import hot_routes

    app = create_app(FakeEngine(step_s=0.0), ServerArgs())
    forwarded: list[str] = []

    async def behind(scope: Any, receive: Any, send: Any) -> None:
        forwarded.append(scope["path"])
        await app(scope, receive, send)

    lean = HotRoutes(behind, hot_routes())

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        await lean({**scope, "app": app}, receive, send)  # as Starlette's call sets it

    for path, body in VALID:
        assert (await _post(outer, path, body, None)).status_code == 200, (path, body)
    assert forwarded == []
    assert (await _post(outer, CHAT, b"{", None)).status_code == 400
    assert forwarded == [CHAT]


def test_sampling_memo_keeps_only_valid_dicts() -> None:
    """Each distinct valid sampling dict is validated once; an invalid one is refused every
    time, and values equal in Python but not in type (4, 4.0, True) are told apart."""
    from sgdsl.runtime.errors import InvalidRequestError
    from sgdsl.runtime.server.context import ServerContext

    c = ServerContext.build(FakeEngine(step_s=0.0), ServerArgs())
    ok = {"max_new_tokens": 4, "temperature": 0.5, "stop": ["x"], "seed": None}
    assert c.sampling(ok) == c.sampling(dict(ok)) == {k: v for k, v in ok.items() if v is not None}
    c.sampling({"max_new_tokens": 4})  # kept: 4.0 and True below must not match it
    assert len(c.checked) == 2
    for bad in ({"max_new_tokens": 4.0}, {"max_new_tokens": True}, {"temperature": -1},
                {"max_new_tokens": 4, "stop": [""]}, {"max_new_tokens": 4, "stop": [1]}):
        for _ in range(2):
            with pytest.raises(InvalidRequestError):
                c.sampling(bad)
    assert len(c.checked) == 2
    big = {"max_new_tokens": 4, "json_schema": json.dumps({"description": "x" * 5000})}
    c.sampling(big)
    assert len(c.checked) == 2  # a large schema is validated, not kept


def _requests_counted(text: str, route: str, status: int) -> float:
    """The http-requests counter of (route, status) in a /metrics text (0 when absent)."""
    label = f'route="{route}",status="{status}"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if "_http_requests_total{" in line and label in line.replace(" ", ""))


async def test_front_counts_each_request_once_and_passes_the_rest_to_fastapi() -> None:
    """The front (the hot paths served before FastAPI's stack) guards a hot path's request
    once, whether it answers it or passes it on to the app (a body FastAPI answers, another
    method): one count per request, the app's own answer."""
    app = create_app(FakeEngine(step_s=0.0), ServerArgs())
    assert app.front is not None and "/generate" in app.front_paths
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        ok = await client.post("/generate", json={"input_ids": [5, 6],
                                                  "sampling_params": {"max_new_tokens": 2}})
        bad = await client.post("/generate", json={"text": 5})
        wrong = await client.get("/generate")
        text = (await client.get("/metrics")).text
    assert (ok.status_code, bad.status_code, wrong.status_code) == (200, 400, 405)
    assert "text" in bad.text  # the app's validation answer names the field
    for status in (200, 400, 405):
        assert _requests_counted(text, "/generate", status) == 1.0, (status, text)


async def test_no_front_where_middleware_must_come_first() -> None:
    """With CORS configured, every request takes the whole stack (the preflight is answered
    before the API key check), so the front is off."""
    app = create_app(FakeEngine(step_s=0.0), ServerArgs(api_key="k", cors_origins=("*",)))
    assert app.front is None
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        pre = await client.options("/generate", headers={
            "origin": "http://a", "access-control-request-method": "POST"})
        denied = await client.post("/generate", json={"input_ids": [5]})
    assert pre.status_code == 200 and denied.status_code == 401

"""Fixtures: the runtime backends (Local over a fake Engine, RuntimeEndpoint over an httpx
MockTransport), both answering from one ``FakeRuntime``."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from sgdsl.backends.local import Local
from sgdsl.backends.runtime_endpoint import RuntimeEndpoint

from srt_fakes import FakeRuntime


class FakeEngine:
    """The slice of ``sgdsl.runtime.Engine`` that Local uses."""

    def __init__(self, runtime: FakeRuntime, hang_stream: bool = False) -> None:
        self.runtime = runtime
        self.model_info = runtime.model_info
        self.hang_stream = hang_stream
        self.error: Exception | None = None

    def server_info(self) -> dict[str, Any]:
        return self.runtime.server_info()

    def flush_cache(self) -> bool:
        return True

    def abort(self, rid: str) -> None:
        self.runtime.aborted.append(rid)

    async def async_generate(self, prompt: Any = None, stream: bool = False, **kw: Any) -> Any:
        if self.error is not None:
            raise self.error
        req = {k: v for k, v in kw.items() if v is not None}
        if prompt is not None:
            req["text"] = prompt
        if stream:
            req["stream"] = True
            return self._stream(req)
        return self.runtime.generate(req)

    async def _stream(self, req: dict) -> Any:
        for chunk in self.runtime.stream(req):
            yield chunk
            if self.hang_stream:
                await asyncio.sleep(3600)


def sse_body(chunks: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def make_endpoint(runtime: FakeRuntime, hang_stream: bool = False,
                  status: int = 200, error: dict | None = None) -> RuntimeEndpoint:
    def sync_handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json=runtime.model_info)
        if request.url.path == "/get_server_info":
            return httpx.Response(200, json=runtime.server_info())
        if request.url.path == "/flush_cache":
            return httpx.Response(200)
        return httpx.Response(404)

    async def slow_stream(chunks: list[dict]) -> Any:
        yield b"data: " + json.dumps(chunks[0]).encode() + b"\n\n"
        await asyncio.sleep(3600)

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        if request.url.path == "/abort_request":
            runtime.aborted.append(body["rid"])
            return httpx.Response(200)
        if error is not None:
            return httpx.Response(status, json=error)
        if body.get("stream"):
            chunks = runtime.stream(body)
            if hang_stream:
                return httpx.Response(200, content=slow_stream(chunks))
            return httpx.Response(200, content=sse_body(chunks))
        return httpx.Response(200, json=runtime.generate(body))

    return RuntimeEndpoint("http://fake:30000", transport=httpx.MockTransport(handler),
                           sync_transport=httpx.MockTransport(sync_handler))


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture(params=["Local", "RuntimeEndpoint"])
def srt_backend(request: pytest.FixtureRequest, runtime: FakeRuntime) -> Any:
    if request.param == "Local":
        return Local(engine=FakeEngine(runtime))
    return make_endpoint(runtime)

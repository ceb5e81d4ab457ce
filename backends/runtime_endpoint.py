"""``RuntimeEndpoint``: programs run on an sgdsl (or SGLang) server over HTTP with ``httpx``:
SGLang-native ``/generate`` (SSE parsed event by event when streaming), ``/get_model_info``,
``/get_server_info``, ``/flush_cache`` and ``/abort_request``.

Single-prompt requests issued in the same moment (``run_batch``'s programs) go to the server as
one list ``/generate`` (the ``Coalescer``, as ``Local`` does for the Engine): one HTTP request
instead of hundreds. httpx's connection pool scans every connection on every request event, so
256 concurrent requests cost its client ~1.9 s of CPU on the 2-core dev box where one list
request costs milliseconds, and its default cap of 100 connections would hold the rest back.
Streams and other requests still go one HTTP request each, with no connection cap."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import httpx

from sgdsl.runtime.errors import error_of

from ._common import backend_error
from .base import BackendError
from .coalescer import Coalescer, batchable
from .loop_local import LoopLocal
from .srt import SrtBackend

_TIMEOUT = httpx.Timeout(None, connect=10.0)  # generations may take long; connecting may not
# No cap on connections (httpx's default of 100 would queue a 256-program batch's streams);
# idle ones kept are bounded, since the pool's per-request scan walks every connection.
_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=64)


class RuntimeEndpoint(SrtBackend):
    """A running server at ``base_url`` (e.g. ``http://127.0.0.1:30000``)."""

    name = "RuntimeEndpoint"

    def __init__(self, base_url: str, api_key: str | None = None, verify: Any = True,
                 transport: httpx.AsyncBaseTransport | None = None,
                 sync_transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._verify = verify
        self._transport = transport
        self._sync_transport = sync_transport
        self._clients = LoopLocal(self._new_client)
        self._coalescers = LoopLocal(lambda: Coalescer(self._post_generate, self._failed))
        self._model_info: dict[str, Any] | None = None
        self._init_capabilities()

    # ---- sync endpoints (used at construction and by sgdsl.flush_cache/get_server_info) ----

    def _get_sync(self, path: str, method: str = "GET", body: Any = None) -> Any:
        try:
            with httpx.Client(base_url=self.base_url, headers=self._headers, verify=self._verify,
                              transport=self._sync_transport, timeout=_TIMEOUT) as client:
                resp = client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise backend_error(self.name, exc, what=f"{method} {path} failed") from exc
        _raise_for_status(self.name, resp, f"{method} {path}")
        if "json" in resp.headers.get("content-type", ""):
            return resp.json()
        return resp.text  # e.g. "Cache flushed."

    @property
    def model_info(self) -> dict[str, Any]:
        if self._model_info is None:
            self._model_info = self._get_sync("/get_model_info")
        return dict(self._model_info)

    def server_info(self) -> dict[str, Any]:
        return self._get_sync("/get_server_info")

    def flush_cache(self) -> bool:
        self._get_sync("/flush_cache", method="POST")
        return True

    # ---- transport --------------------------------------------------------------------------

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                 verify=self._verify, transport=self._transport, timeout=_TIMEOUT,
                                 limits=_LIMITS)

    async def _call(self, request: dict[str, Any]) -> dict | list[dict]:
        if batchable(request):
            return await self._coalescers.get().submit(request)
        return await self._post_generate(request)

    async def _post_generate(self, request: dict[str, Any]) -> dict | list[dict]:
        try:
            resp = await self._clients.get().post("/generate", json=request)
        except httpx.HTTPError as exc:
            raise backend_error(self.name, exc, what="POST /generate failed") from exc
        _raise_for_status(self.name, resp, "POST /generate")
        return resp.json()

    def _failed(self, out: dict[str, Any]) -> BaseException | None:
        """A list answer reports a request that failed in its own output (finish_reason with
        the error): the BackendError its caller gets."""
        cause = error_of((out.get("meta_info") or {}).get("finish_reason"))
        return None if cause is None else backend_error(self.name, cause)

    async def _call_stream(self, request: dict[str, Any]) -> AsyncIterator[dict]:
        try:
            async with self._clients.get().stream("POST", "/generate", json=request) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    _raise_for_status(self.name, resp, "POST /generate")
                async for event in _sse_events(resp.aiter_lines()):
                    if event == "[DONE]":
                        return
                    data = json.loads(event)
                    if isinstance(data, dict) and "error" in data and "text" not in data:
                        raise _error_from_body(self.name, data, resp)
                    yield data
        except httpx.HTTPError as exc:
            raise backend_error(self.name, exc, what="POST /generate (stream) failed") from exc

    async def _abort(self, rid: str) -> None:
        try:  # shielded: the caller's task is being cancelled
            await asyncio.shield(self._clients.get().post("/abort_request", json={"rid": rid}))
        except (httpx.HTTPError, asyncio.CancelledError, RuntimeError):
            pass  # the request already finished, or the server went away: nothing to abort

    async def close(self) -> None:
        await self._clients.aclose_current()


async def _sse_events(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The data payload of each server-sent event (multi-line data joined with newlines)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        # other fields (event:, id:, retry:, comments) carry nothing we need
    if data:
        yield "\n".join(data)


def _error_from_body(name: str, body: Any, resp: httpx.Response) -> BackendError:
    """The server's error (an HTTP error status, or an error event inside a 200 stream)."""
    err = body.get("error", body) if isinstance(body, dict) else body
    message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    code = err.get("code") if isinstance(err, dict) else None
    status = code if isinstance(code, int) else resp.status_code
    cause = httpx.HTTPStatusError(message, request=resp.request, response=resp)
    return backend_error(name, cause, status=status)


def _raise_for_status(name: str, resp: httpx.Response, what: str) -> None:
    if resp.status_code < 400:
        return
    try:
        body: Any = resp.json()
    except ValueError:
        body = resp.text
    raise _error_from_body(name, body, resp)

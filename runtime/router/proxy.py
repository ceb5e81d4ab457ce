"""Forwarding a request to a worker: the policy's choice, retries with exponential backoff and
jitter while nothing has reached the client, SSE passed through chunk by chunk.

A non-streaming answer is read in full before the client sees a byte, so any worker failure is
retried on another worker. A stream is committed once its first chunk arrived; a worker that
breaks after that ends the client's stream with an error event in the route's protocol shape
(the status line is long gone). Every upstream read has a timeout, so a hung worker fails too.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

import httpx
from starlette.requests import Request
from starlette.responses import Response

from .. import hop_times  # hops:
from ..server.errors import error_body, protocol_of
from ..server.sse import DONE, SSEResponse
from .config import RouterConfig
from .metrics import RouterMetrics
from .policies import Choice, Policy
from .raw_response import RawResponse, open_raw
from .registry import WorkerRegistry
from .request_text import answered_prompt_tokens
from .worker import Worker

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({502, 503, 504})  # the worker is down or overloaded: try another
_PASS_HEADERS = ("content-type", "authorization", "x-api-key", "anthropic-version",
                 "anthropic-beta", "accept")


@dataclass(frozen=True)
class Upstream:
    """What is sent to a worker (same for every attempt)."""

    method: str
    path: str
    query: str
    body: bytes
    headers: dict[str, str]
    route_text: str  # what the policy routes on; "" for info routes
    use_policy: bool = True
    output_tokens: int = 0  # the request's output budget (0: not given)
    stream: bool = False  # the body asks for a stream: relayed over a RawResponse


class AttemptFailed(Exception):
    """The worker failed before the client got a byte: retry elsewhere."""


class WorkerDown(Exception):
    """The health checker found the worker down while a request waited on it."""


def json_error(path: str, status: int, message: str, param: str | None = None) -> Response:
    """An error answer in the route's protocol shape (native, OpenAI or Anthropic)."""
    body = error_body(protocol_of(path), status, message, param)
    return Response(json.dumps(body), status_code=status, media_type="application/json")


def sse_error(protocol: str, message: str) -> bytes:
    """The in-stream error event (and the end-of-stream marker where the protocol has one)."""
    body = error_body(protocol, 502, message)
    if protocol == "anthropic":
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    return f"data: {json.dumps(body)}\n\n".encode() + DONE


class Proxy:
    def __init__(self, config: RouterConfig, registry: WorkerRegistry, policy: Policy,
                 metrics: RouterMetrics, client: httpx.AsyncClient) -> None:
        self.config = config
        self.registry = registry
        self.policy = policy
        self.metrics = metrics
        self.client = client

    def headers_for(self, request: Request) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k in _PASS_HEADERS}
        if self.config.worker_api_key:
            headers.pop("x-api-key", None)
            headers["authorization"] = f"Bearer {self.config.worker_api_key}"
        return headers

    def backoff_s(self, attempt: int) -> float:
        """Exponential backoff with full jitter before retry number ``attempt`` (1-based)."""
        c = self.config
        return random.uniform(0, min(c.backoff_max_s, c.backoff_base_s * 2 ** (attempt - 1)))

    async def forward(self, request: Request, up: Upstream) -> Response:
        tried: set[str] = set()
        reason = "no worker is registered"
        for attempt in range(self.config.max_retries + 1):
            candidates = self.registry.available(frozenset(tried)) or self.registry.available()
            if not candidates:
                reason = self._why_none()
                break
            if attempt:
                self.metrics.retries.labels(route=up.path).inc()
                await asyncio.sleep(self.backoff_s(attempt))
            choice = self._choose(candidates, up)
            worker = choice.worker
            try:
                return await self._attempt(choice, request, up)
            except AttemptFailed as exc:
                reason = str(exc)
                tried.add(worker.url)
                logger.warning("attempt %d of %s on %s failed: %s", attempt + 1, up.path,
                               worker.url, reason)
        self.metrics.failed.labels(route=up.path, reason="no_worker").inc()
        return json_error(up.path, 503, f"no worker could serve the request: {reason}")

    def _why_none(self) -> str:
        workers = self.registry.workers.values()
        if not workers:
            return "no worker is registered"
        return "no worker is available (" + ", ".join(
            f"{w.url}: {'circuit ' + w.breaker.state if w.healthy else 'unhealthy'}"
            for w in workers) + ")"

    def _choose(self, candidates: list[Worker], up: Upstream) -> Choice:
        if not up.use_policy:
            return Choice(min(candidates, key=lambda w: w.load), "any")
        choice = self.policy.select(candidates, up.route_text, up.output_tokens)
        self.metrics.decisions.labels(policy=self.policy.name, worker=choice.worker.url,
                                      reason=choice.reason).inc()
        return choice

    async def _attempt(self, choice: Choice, request: Request, up: Upstream) -> Response:
        worker = choice.worker
        ticket = worker.start(choice.prefill, choice.decode)  # until the answer has ended
        worker.breaker.on_attempt()
        handed_off = False
        try:
            resp = await self._send(worker, up)
            if resp.headers.get("content-type", "").startswith("text/event-stream"):
                chunks = resp.aiter_bytes()
                first = await self._first_chunk(worker, resp, chunks)
                handed_off = True
                # SSEResponse closes the relay however the client leaves (upstream closed too).
                return SSEResponse(self._relay(worker, ticket, resp, chunks, first, up))
            return await self._buffered(worker, resp, request, up)
        finally:
            if not handed_off:
                worker.finish(ticket)
                worker.breaker.release()  # a no-op unless this half-open trial ended unjudged

    async def _send(self, worker: Worker, up: Upstream) -> httpx.Response | RawResponse:
        target = up.path + (f"?{up.query}" if up.query else "")
        if up.stream and worker.url.startswith("http://"):
            c = self.config
            sending = open_raw(worker.url, up.method, target, up.body, up.headers,
                               c.connect_timeout_s, c.read_timeout_s)
        else:
            sending = self.client.send(self.client.build_request(
                up.method, worker.url + target, content=up.body or None, headers=up.headers),
                stream=True)
        try:
            resp = await _unless_down(worker, sending)
        except (httpx.HTTPError, WorkerDown) as exc:
            raise self._failed(worker, "connect", f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code in RETRYABLE_STATUS:
            text = (await _read_quietly(resp))[:300]
            raise self._failed(worker, f"status_{resp.status_code}",
                               f"worker answered {resp.status_code}: {text}")
        worker.open_responses.add(resp)
        return resp

    async def _first_chunk(self, worker: Worker, resp: httpx.Response,
                           chunks: AsyncIterator[bytes]) -> bytes:
        try:
            first = await _unless_down(worker, chunks.__anext__())
        except StopAsyncIteration:
            first = b""
        except Exception as exc:  # noqa: BLE001 - a read error, or closed by the health checker
            await _close(worker, resp)
            raise self._failed(worker, "stream_start", f"{type(exc).__name__}: {exc}") from exc
        worker.breaker.on_success()
        return first

    async def _buffered(self, worker: Worker, resp: httpx.Response, request: Request,
                        up: Upstream) -> Response:
        started = time.monotonic()
        reader = asyncio.ensure_future(resp.aread())
        down = worker.down_signal()
        try:
            while not reader.done():
                await asyncio.wait({reader, down}, timeout=0.5,
                                   return_when=asyncio.FIRST_COMPLETED)
                if down.done() and not reader.done():
                    raise WorkerDown("the worker was found down while answering")
                if not reader.done() and await request.is_disconnected():
                    # NOTE: closing the upstream connection makes the worker abort the request.
                    reader.cancel()
                    self.metrics.failed.labels(route=up.path, reason="client_gone").inc()
                    return Response(status_code=499)
            body = reader.result()
        except Exception as exc:  # noqa: BLE001 - a read error, or closed by the health checker
            raise self._failed(worker, "read", f"{type(exc).__name__}: {exc}") from exc
        finally:
            reader.cancel()
            down.cancel()
            await _close(worker, resp)
        worker.breaker.on_success()
        worker.served += 1
        if up.use_policy and resp.status_code == 200 and up.route_text:
            self.policy.observe(len(up.route_text), answered_prompt_tokens(body))
        self.metrics.requests.labels(route=up.path, worker=worker.url,
                                     status=str(resp.status_code)).inc()
        self.metrics.latency.labels(route=up.path).observe(time.monotonic() - started)
        ctype = resp.headers.get("content-type")
        return Response(body, status_code=resp.status_code,
                        headers={"content-type": ctype} if ctype else None)

    async def _relay(self, worker: Worker, ticket: int, resp: httpx.Response,
                     chunks: AsyncIterator[bytes], first: bytes,
                     up: Upstream) -> AsyncIterator[bytes]:
        started, tail, status = time.monotonic(), first[-2:], str(resp.status_code)
        try:
            yield _hop_stamped(first, tail)
            async for chunk in chunks:
                tail = (tail + chunk)[-2:]
                yield _hop_stamped(chunk, tail)
        except Exception as exc:  # noqa: BLE001 - whatever broke, the client gets a reason
            worker.breaker.on_failure()
            self.metrics.worker_errors.labels(worker=worker.url, kind="stream_broken").inc()
            self.metrics.failed.labels(route=up.path, reason="stream_broken").inc()
            status = "stream_broken"
            message = (f"worker {worker.url} failed after the stream started "
                       f"({type(exc).__name__}: {exc}); the output is incomplete")
            # An event cut in half is closed first, so the error event parses on its own.
            yield (b"" if tail == b"\n\n" else b"\n\n") + sse_error(protocol_of(up.path), message)
        finally:
            await _close(worker, resp)
            worker.finish(ticket)
            worker.served += 1
            self.metrics.requests.labels(route=up.path, worker=worker.url, status=status).inc()
            self.metrics.latency.labels(route=up.path).observe(time.monotonic() - started)

    def _failed(self, worker: Worker, kind: str, message: str) -> AttemptFailed:
        worker.breaker.on_failure()
        worker.last_error = message
        self.metrics.worker_errors.labels(worker=worker.url, kind=kind).inc()
        return AttemptFailed(f"{worker.url}: {message}")

    async def broadcast(self, method: str, path: str, body: bytes,
                        headers: dict[str, str]) -> list[tuple[Worker, int, str]]:
        """Send to every healthy worker at once: (worker, status or 0, text) each."""
        workers = self.registry.healthy()

        async def one(w: Worker) -> tuple[Worker, int, str]:
            try:
                r = await self.client.request(method, w.url + path, content=body or None,
                                              headers=headers)
                return w, r.status_code, r.text
            except httpx.HTTPError as exc:
                return w, 0, f"{type(exc).__name__}: {exc}"

        return list(await asyncio.gather(*(one(w) for w in workers)))


def _hop_stamped(chunk: bytes, tail: bytes) -> bytes:
    """hops: ``chunk`` + when it left, after a whole event ($SGDSL_HOP_TIMES only)."""
    if hop_times.ENABLED and tail == b"\n\n":
        return chunk + hop_times.router_comment(time.time())
    return chunk


async def _unless_down(worker: Worker, awaitable: Any) -> Any:
    """Await ``awaitable`` unless the worker is found down first (then WorkerDown)."""
    task = asyncio.ensure_future(awaitable)
    down = worker.down_signal()
    try:
        await asyncio.wait({task, down}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        down.cancel()
        if not task.done():  # found down, or our caller was cancelled (client gone)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise WorkerDown("the worker was found down before it answered")
    return task.result()


async def _close(worker: Worker, resp: httpx.Response) -> None:
    worker.open_responses.discard(resp)
    await resp.aclose()


async def _read_quietly(resp: httpx.Response) -> str:
    try:
        await resp.aread()
        return resp.text
    except httpx.HTTPError as exc:
        return f"({type(exc).__name__})"
    finally:
        await resp.aclose()


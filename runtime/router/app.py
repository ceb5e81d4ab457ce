"""The router's FastAPI app: protocol routes proxied to a worker the policy chooses, info
routes answered by any worker, cache/abort broadcast to all, and the admin routes
``/add_worker``, ``/remove_worker``, ``/list_workers``, plus ``/health`` and ``/metrics``."""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import InvalidRequestError
from .config import RouterConfig, normalize_worker_url
from .metrics import RouterMetrics
from .policies import Policy, make_policy
from .poller import LoadPoller
from .proxy import Proxy, Upstream, json_error
from .registry import HealthChecker, WorkerRegistry, probe
from .request_text import output_budget, routing_text

ROUTED = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/messages")
ANY_WORKER = ("/get_model_info", "/model_info", "/get_server_info", "/server_info", "/v1/models",
              "/health_generate")
OPEN_PATHS = frozenset({"/health"})


@dataclass(frozen=True)
class RouterState:
    config: RouterConfig
    registry: WorkerRegistry
    policy: Policy
    metrics: RouterMetrics
    proxy: Proxy
    health: HealthChecker
    client: httpx.AsyncClient
    poller: LoadPoller | None = None  # the workers' GET /load, for policies that balance work


def build_state(config: RouterConfig) -> RouterState:
    policy = make_policy(config)
    registry = WorkerRegistry(config, on_change=policy.on_change)

    def snapshot() -> tuple[list, dict[str, int]]:
        trees = getattr(policy, "trees", {})  # only cache_aware keeps trees
        return list(registry.workers.values()), {u: t.size for u, t in trees.items()}

    metrics = RouterMetrics(snapshot)
    timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
    # An idle upstream connection is dropped well before the workers' own 5 s keep-alive
    # (uvicorn's default) closes it, so a request never goes out on one the worker is closing.
    client = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(
        max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0))
    key = config.worker_api_key or config.api_key  # replicas of --dp-size share the key
    # pd: only the prefill side is chosen by the policy (decode: the least in flight), so
    # the decode workers' /load (a scheduler stats call each, 20 a second) is not polled.
    only = frozenset(config.prefill_urls) if config.pd_disaggregation else None
    poller = LoadPoller(registry, client, {"Authorization": f"Bearer {key}"} if key else {},
                        only) if policy.needs_load else None
    proxy_cls = Proxy
    if config.pd_disaggregation:  # pd: each request goes to a prefill and a decode worker
        from .pd_proxy import PDProxy as proxy_cls
    return RouterState(config, registry, policy, metrics,
                       proxy_cls(config, registry, policy, metrics, client),
                       HealthChecker(registry, client), client, poller)


def create_app(config: RouterConfig, on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """The router app. ``on_shutdown`` runs (in a thread) once it has drained: with
    ``--dp-size``, stopping the replicas."""
    state = build_state(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.health.check_all(initial=True)
        state.health.start()
        if state.poller is not None:
            await state.poller.poll_all()
            state.poller.start()
        yield
        if state.poller is not None:
            await state.poller.stop()
        await state.health.stop()
        await state.client.aclose()
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)

    app = FastAPI(title="sgdsl router", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.state.router = state
    for path in ROUTED:
        app.add_api_route(path, _routed, methods=["POST"])
    for path in ANY_WORKER:
        app.add_api_route(path, _any_worker, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", _any_worker, methods=["GET"])
    app.add_api_route("/flush_cache", _flush_cache, methods=["GET", "POST"])
    app.add_api_route("/abort_request", _abort, methods=["POST"])
    app.add_api_route("/precompile", _precompile, methods=["POST"])
    app.add_api_route("/debug/check_idle_integrity", _idle_integrity, methods=["GET"])
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    app.add_api_route("/list_workers", _list_workers, methods=["GET"])
    app.add_api_route("/add_worker", _add_worker, methods=["POST"])
    app.add_api_route("/remove_worker", _remove_worker, methods=["POST"])
    app.add_middleware(Guard, config=config)
    app.add_exception_handler(InvalidRequestError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app


def st(request: Request) -> RouterState:
    return request.app.state.router


class Guard:
    """API key (when configured) and body size, answered in the route's protocol shape.
    NOTE: plain ASGI, not BaseHTTPMiddleware, which would copy every streamed chunk through a
    memory channel."""

    def __init__(self, app: ASGIApp, config: RouterConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        denial = self._deny(scope["path"], Headers(scope=scope))
        if denial is not None:
            await denial(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _deny(self, path: str, headers: Headers) -> Response | None:
        c = self.config
        if c.api_key and path not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key")
            if given != c.api_key:
                return json_error(path, 401, "invalid or missing API key")
        size = headers.get("content-length")
        if size and size.isdigit() and int(size) > c.max_body_bytes:
            return json_error(path, 413, f"request body of {size} bytes exceeds the limit of "
                                         f"{c.max_body_bytes} bytes")
        return None


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods, in the route's protocol shape like every other error."""
    assert isinstance(exc, StarletteHTTPException)
    return json_error(request.url.path, exc.status_code, f"{request.method} "
                      f"{request.url.path}: {exc.detail}")


async def _invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InvalidRequestError)
    return json_error(request.url.path, 400, str(exc), exc.field)


async def _routed(request: Request) -> Response:
    s, path = st(request), request.url.path
    try:
        body = await request.body()
    except ClientDisconnect:  # the client left mid-upload: nobody to answer, nothing to log
        return Response(status_code=499)
    if len(body) > s.config.max_body_bytes:  # a chunked upload has no content-length to check
        return json_error(path, 413, f"request body of {len(body)} bytes exceeds the limit of "
                                     f"{s.config.max_body_bytes} bytes")
    try:
        payload = json.loads(body)
    except ValueError as exc:
        return json_error(path, 400, f"malformed JSON body: {exc}")
    if not isinstance(payload, dict):
        return json_error(path, 400, "the request body must be a JSON object")
    up = Upstream("POST", path, request.url.query, body, s.proxy.headers_for(request),
                  routing_text(path, payload), output_tokens=output_budget(path, payload),
                  stream=payload.get("stream") is True)
    return await s.proxy.forward(request, up)


async def _any_worker(request: Request) -> Response:
    s = st(request)
    up = Upstream("GET", request.url.path, request.url.query, b"", s.proxy.headers_for(request),
                  "", use_policy=False)
    return await s.proxy.forward(request, up)


async def _broadcast(request: Request, method: str, path: str) -> tuple[list, list]:
    s = st(request)
    results = await s.proxy.broadcast(method, path, await request.body(),
                                      s.proxy.headers_for(request))
    bad = [f"{w.url}: {status or 'unreachable'} {text[:200]}" for w, status, text in results
           if status != 200]
    return results, bad


async def _flush_cache(request: Request) -> Response:
    results, bad = await _broadcast(request, "POST", "/flush_cache")
    if not results:
        return json_error(request.url.path, 503, "no healthy worker to flush")
    if bad:
        return json_error(request.url.path, 400, "Cache not flushed on every worker: "
                                                 + "; ".join(bad))
    return PlainTextResponse("Cache flushed.")


async def _precompile(request: Request) -> Response:
    """Every worker compiles the constraints (each needs them in memory; replicas on one
    machine share compiles through the grammar disk cache). A constraint is ok only if it is
    ok on every worker; otherwise its result is the first worker's error."""
    results, bad = await _broadcast(request, "POST", "/precompile")
    if not results:
        return json_error(request.url.path, 503, "no healthy worker to precompile on")
    if bad:
        status = next((s for _, s, _ in results if s and s != 200), 502)
        return json_error(request.url.path, status, "precompile failed on: " + "; ".join(bad))
    per_worker = [json.loads(text)["results"] for _, _, text in results]
    merged = [next((r for r in column if not r["ok"]), column[0])
              for column in zip(*per_worker)]
    return JSONResponse({"results": merged, "workers": len(results)})


async def _abort(request: Request) -> Response:
    # The rid's worker is not tracked: every worker gets the abort; unknown rids are no-ops.
    await _broadcast(request, "POST", "/abort_request")
    return PlainTextResponse("OK")


async def _idle_integrity(request: Request) -> Response:
    results, bad = await _broadcast(request, "GET", "/debug/check_idle_integrity")
    if bad:
        return json_error(request.url.path, 409, "idle integrity check failed: " + "; ".join(bad))
    return JSONResponse({"ok": True, "workers": len(results)})


async def _health(request: Request) -> Response:
    healthy = st(request).registry.healthy()
    if not healthy:
        return json_error(request.url.path, 503, "no healthy worker")
    return PlainTextResponse("OK")


async def _metrics(request: Request) -> Response:
    return Response(st(request).metrics.render(),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


async def _list_workers(request: Request) -> Response:
    s = st(request)
    return JSONResponse({**s.policy.describe(), "workers": s.registry.describe()})


async def _worker_url(request: Request) -> str:
    """``?url=`` (as SGLang's router takes it) or a JSON body ``{"url": ...}``."""
    url = request.query_params.get("url")
    if url is None:
        body = await request.body()
        try:
            payload = json.loads(body) if body else {}
        except ValueError as exc:
            raise InvalidRequestError(f"malformed JSON body: {exc}") from exc
        url = payload.get("url") if isinstance(payload, dict) else None
    if url is None:
        raise InvalidRequestError("url: required (?url=http://HOST:PORT or {\"url\": ...})",
                                  field="url")
    return url


async def _add_worker(request: Request) -> Response:
    s = st(request)
    url = await _worker_url(request)
    url = normalize_worker_url(url)
    if url in s.registry.workers:
        raise InvalidRequestError(f"url: worker {url} is already registered", field="url")
    reason = await probe(s.client, url, s.config.health_timeout_s)
    if reason:
        raise InvalidRequestError(f"url: worker {url} did not pass its health check: {reason}",
                                  field="url")
    s.registry.add(url)
    return JSONResponse({"added": url, "workers": s.registry.describe()})


async def _remove_worker(request: Request) -> Response:
    s = st(request)
    worker = s.registry.remove(await _worker_url(request))
    # Requests in flight on it finish normally; it only gets no new ones.
    return JSONResponse({"removed": worker.url, "in_flight": worker.load,
                         "workers": s.registry.describe()})


__all__ = ["create_app", "RouterState"]

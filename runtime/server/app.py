"""The FastAPI application: one engine behind the SGLang-native, OpenAI and Anthropic routes.

``create_app`` does not own the engine (the CLI or a test does): the app can be built around a
running Engine, served by uvicorn in-process, and torn down without stopping the engine.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from fastapi.routing import APIRoute

from . import anthropic_api, load, native, openai_api
from .anthropic_protocol import MessagesRequest
from .args import ServerArgs
from .context import ServerContext, ctx
from .errors import ClientDisconnected, install_error_handlers
from .hot_routes import FRONT, HotRoute, HotRoutes
from .middleware import GuardMiddleware
from .native_protocol import GenerateRequest
from .openai_protocol import ChatCompletionRequest, CompletionRequest

# NOTE: not a standard status; nginx's "client closed request", logged for aborted requests.
CLIENT_CLOSED = 499


class ServerApp(FastAPI):
    """FastAPI, with the hot POST routes (``hot_routes()``) served in front of its own stack.

    Issue 29: a request of a burst went through uvicorn's, FastAPI's and Starlette's layers
    (telemetry lookups per request, the body-limit and error wrappers, scope copies) before
    the guard and ``HotRoutes``: ~13% of the server loop's Python time per native request
    (py-spy, burst of 32, 2-core box), which a burst pays once per request before the
    scheduler has its first prefill wave. ``front`` is the same guard and ``HotRoutes``, run
    first for the hot paths; everything they pass on (another method, a body FastAPI must
    answer) goes through the whole app, marked so that its own guard and ``HotRoutes`` let
    it through (the guard counts it once, as before). None: every request takes the stack
    (create_app leaves it off where middleware must see requests first: CORS, pd)."""

    front: Any = None
    front_paths: frozenset[str] = frozenset()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (self.front is not None and scope["type"] == "http"
                and scope["path"] in self.front_paths and FRONT not in scope):
            if self.root_path:
                scope["root_path"] = self.root_path
            scope["app"] = self  # as Starlette sets it: handlers read app.state through it
            await self.front(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _behind_front(self, scope: Any, receive: Any, send: Any) -> None:
        await super().__call__({**scope, FRONT: True}, receive, send)


def create_app(engine: Any, args: ServerArgs | None = None,
               on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """An app serving ``engine`` (anything with the Engine API of docs/engine_api.md).
    ``on_shutdown`` runs (in a thread) once the server has drained, e.g. ``engine.shutdown``."""
    args = args or ServerArgs()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)

    app = ServerApp(title="sgdsl", docs_url=None, redoc_url=None, openapi_url=None,
                    lifespan=lifespan)
    app.state.ctx = context = ServerContext.build(engine, args)
    for router in (native.router, openai_api.router, anthropic_api.router, load.router):
        app.include_router(router)
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    install_error_handlers(app)
    app.add_exception_handler(ClientDisconnected, _disconnected)
    routes = [r for router in (native.router, openai_api.router, anthropic_api.router, load.router)
              for r in router.routes]
    known = frozenset({"/metrics"} | {r.path for r in routes
                                      if isinstance(r, APIRoute) and "{" not in r.path})
    # Added first = innermost: behind the guard (API key, body size, metrics), before FastAPI.
    guard = dict(api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                 metrics=context.metrics, known_paths=known)
    app.add_middleware(HotRoutes, routes=hot_routes())
    app.add_middleware(GuardMiddleware, **guard)
    config = getattr(engine, "config", None)
    pd = getattr(config, "disaggregation_mode", "null") != "null"
    if not pd and not args.cors_origins:  # those middlewares must see every request first
        app.front = GuardMiddleware(HotRoutes(app._behind_front, hot_routes()), **guard)
        app.front_paths = frozenset(hot_routes())
    if pd:  # pd: the router's bootstrap
        from ..disaggregation.http import BootstrapMiddleware

        app.add_middleware(BootstrapMiddleware)
    if args.cors_origins:
        # Added last = outermost: preflight requests are answered before the API-key check.
        app.add_middleware(CORSMiddleware, allow_origins=list(args.cors_origins),
                           allow_methods=["*"], allow_headers=["*"])
    return app


def hot_routes() -> dict[str, HotRoute]:
    """The POST routes a burst of clients hits, served by ``HotRoutes`` (same handlers)."""
    return {"/generate": HotRoute(GenerateRequest, native.generate),
            "/v1/completions": HotRoute(CompletionRequest, openai_api.completions),
            "/v1/chat/completions": HotRoute(ChatCompletionRequest, openai_api.chat_completions),
            "/v1/messages": HotRoute(MessagesRequest, anthropic_api.messages)}


async def _metrics(request: Request) -> Response:
    body = await asyncio.to_thread(ctx(request).metrics.render)  # engine.stats() is IPC
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _disconnected(request: Request, exc: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED)

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
from .hot_routes import HotRoute, HotRoutes
from .middleware import GuardMiddleware
from .native_protocol import GenerateRequest
from .openai_protocol import ChatCompletionRequest, CompletionRequest

# NOTE: not a standard status; nginx's "client closed request", logged for aborted requests.
CLIENT_CLOSED = 499


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

    app = FastAPI(title="sgdsl", docs_url=None, redoc_url=None, openapi_url=None,
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
    app.add_middleware(HotRoutes, routes=hot_routes())
    app.add_middleware(GuardMiddleware, api_key=args.api_key,
                       max_body_bytes=args.max_body_bytes, metrics=context.metrics,
                       known_paths=known)
    config = getattr(engine, "config", None)
    if getattr(config, "disaggregation_mode", "null") != "null":  # pd: the router's bootstrap
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

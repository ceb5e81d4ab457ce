"""``HotRoutes``: the POST routes a burst of clients hits (chat and text completions, native
``/generate``, Anthropic messages), served without FastAPI's per-request machinery.

Issue 29: at batch 256 the server's event loop spent ~45% of its busy samples in the ASGI
stack around each request (route matching across the included routers, FastAPI's dependency
solving and telemetry, starlette's exception middleware, body reading through ``Request``),
which paces how fast a burst reaches the Engine and how fast its answers leave. This layer sits
inside the guard middleware (API key, body size, metrics still apply first) and, for an
exact hot path with a JSON body, reads the body once, parses it (orjson where installed),
validates it with the route's own pydantic model and calls the route's own handler.

Nothing a client sees changes: a body this layer cannot take as valid (malformed or non-UTF-8
JSON, a non-JSON content type, a field error, an oversized integer) is handed, bytes replayed,
to the FastAPI app, which answers exactly as it always did (the same error shape, message and
field). Errors raised by the handler go through ``error_response``, as the app's handlers do.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .asgi_replay import replay
from .errors import ClientDisconnected, error_response

try:  # NOTE: orjson parses a chat body ~5x faster; json (what FastAPI uses) is the fallback
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on the installation
    _loads = json.loads

Handler = Callable[[Any, Request], Awaitable[Response]]
# NOTE: not a standard status; nginx's "client closed request" (as app.py answers it).
CLIENT_CLOSED = 499
# A scope key: the request was already taken by the front (app.ServerApp: this guard and these
# routes in front of FastAPI's stack), which passed it on; the stack's own copies let it by.
FRONT = "sgdsl.front"


@dataclass(frozen=True)
class HotRoute:
    """A POST path's body model and handler (the very function FastAPI routes to)."""

    model: type[BaseModel]
    handler: Handler


class HotRoutes:
    """ASGI middleware: ``routes`` maps exact paths to their ``HotRoute``; everything else,
    and every body that fails here, goes to ``app`` unchanged."""

    def __init__(self, app: ASGIApp, routes: dict[str, HotRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if (route is None or scope["method"] != "POST" or FRONT in scope
                or not _is_json(scope)):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:  # the client left while sending its body: nobody to answer
            return
        req = _validated(route.model, body)
        if req is None:  # FastAPI answers it, with its own error for the body
            await self.app(scope, replay(body, receive), send)
            return
        response = await self._call(route, req, scope, receive)
        await response(scope, receive, send)

    async def _call(self, route: HotRoute, req: BaseModel, scope: Scope,
                    receive: Receive) -> Response:
        try:
            return await route.handler(req, Request(scope, receive))
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        except Exception as exc:  # the app's exception handlers answer with the same call
            return error_response(Request(scope).url.path, exc)


def _is_json(scope: Scope) -> bool:
    """A JSON content type, as FastAPI reads a body as JSON (``application/json`` or
    ``application/*+json``; the guard has already turned a missing or form type into JSON)."""
    for key, value in scope["headers"]:
        if key.lower() == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or (
                kind.startswith(b"application/") and kind.endswith(b"+json"))
    return False


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _validated(model: type[BaseModel], body: bytes) -> BaseModel | None:
    """The body as ``model`` (validated as FastAPI validates it: python mode, from the parsed
    JSON object), or None for anything else."""
    try:
        data = _loads(body)
        if not isinstance(data, dict):
            return None
        return model.model_validate(data)
    except Exception:  # noqa: BLE001 - any failure is FastAPI's to answer, as before
        return None

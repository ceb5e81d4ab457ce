"""The guard in front of every route: API key, body size limit, request counting.

A pure ASGI middleware on purpose: Starlette's BaseHTTPMiddleware wraps ``receive``, which
would hide client disconnects from the routes that abort on them.
"""
from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body, protocol_of
from .hot_routes import FRONT
from .metrics import ServerMetrics

OPEN_PATHS = frozenset({"/health", "/health_generate"})
# The only headers the guard reads (decoding every header of every request cost more).
_GUARD_HEADERS = frozenset({b"authorization", b"x-api-key", b"content-length"})


class GuardMiddleware:
    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int,
                 metrics: ServerMetrics, known_paths: frozenset[str]) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.known_paths = known_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or FRONT in scope:  # the front's guard has counted it
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in self.known_paths else "other"
        status_box: list[int] = [0]

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
            await send(message)

        scope = _assume_json(scope)
        try:
            denial = self._deny(scope)
            if denial is not None:
                await _send_json(counting_send, *denial)
            else:
                await self.app(scope, receive, counting_send)
        finally:
            self.metrics.observe_request(route, status_box[0] or 499)

    def _deny(self, scope: Scope) -> tuple[int, dict[str, Any]] | None:
        """(status, body) when the request must not reach the route."""
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
                   if k.lower() in _GUARD_HEADERS}
        protocol = protocol_of(path)
        if self.api_key and path not in OPEN_PATHS and scope.get("method") != "OPTIONS":
            if not self._authorized(headers):
                return 401, error_body(protocol, 401, "invalid or missing API key",
                                       code="invalid_api_key")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return 413, error_body(protocol, 413, f"request body larger than "
                                                  f"{self.max_body_bytes} bytes")
        return None

    def _authorized(self, headers: dict[str, str]) -> bool:
        """OpenAI style ``Authorization: Bearer KEY`` or Anthropic style ``x-api-key: KEY``."""
        assert self.api_key is not None
        candidates = [headers.get("x-api-key", "")]
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            candidates.append(auth[7:].strip())
        key = self.api_key.encode()
        return any(hmac.compare_digest(c.encode(), key) for c in candidates if c)


def _assume_json(scope: Scope) -> Scope:
    """Every body this server takes is JSON: a POST sent without a JSON content type (curl's
    default is form-encoded) is read as JSON instead of failing on the content type."""
    if scope.get("method") != "POST":
        return scope
    kind = next((v for k, v in scope["headers"] if k.lower() == b"content-type"), b"")
    if kind and not kind.startswith(b"application/x-www-form-urlencoded"):
        return scope  # NOTE: checked first: the usual case copies nothing (issue 29)
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
    return {**scope, "headers": headers + [(b"content-type", b"application/json")]}


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})

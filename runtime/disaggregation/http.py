"""The server side of the bootstrap: an ASGI middleware that takes SGLang's ``bootstrap_host``,
``bootstrap_port`` and ``bootstrap_room`` out of a JSON request body and opens a bootstrap scope
(``bootstrap.py``) for the request, so the protocol routes (native, OpenAI, Anthropic) need no
field of their own. Installed only on servers in a disaggregation mode."""
from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .bootstrap import close_scope, open_scope

FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
ROUTES = frozenset({"/generate", "/v1/completions", "/v1/chat/completions", "/v1/messages"})


class BootstrapMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ROUTES or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        payload, fields = _split(body)
        if fields is None:
            await self.app(scope, _replay(body, receive), send)
            return
        token = open_scope(*fields)
        try:
            await self.app(scope, _replay(json.dumps(payload).encode(), receive), send)
        finally:
            close_scope(token)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, upstream: Receive) -> Receive:
    """The (rewritten) body once, then the client's own messages (its disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await upstream()

    return receive


def _split(body: bytes) -> tuple[Any, tuple[str, int, int] | None]:
    """The body without the bootstrap fields, and (host, port, room) when all three were
    given; a body that is not a JSON object passes through untouched (the route answers it)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(payload, dict) or payload.get("bootstrap_room") is None:
        return payload, None
    host, port, room = (payload.pop(name, None) for name in FIELDS)
    try:
        return payload, (str(host), int(port), int(room))
    except (TypeError, ValueError):
        return payload, None

"""The server side of the bootstrap: an ASGI middleware that takes SGLang's ``bootstrap_host``,
``bootstrap_port`` and ``bootstrap_room`` out of a JSON request body and opens a bootstrap scope
(``bootstrap.py``) for the request, so the protocol routes (native, OpenAI, Anthropic) need no
field of their own. Installed only on servers in a disaggregation mode."""
from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..server.asgi_replay import replay
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
            await self.app(scope, replay(body, receive), send)
            return
        token = open_scope(*fields)
        try:
            sender = _Send(send)
            await _watched(self.app(scope, replay(json.dumps(payload).encode(), receive), sender),
                           receive, sender)
        finally:
            close_scope(token)


class _Send:
    """``send`` that notes whether the response has started."""

    def __init__(self, send: Send) -> None:
        self.send, self.started = send, False

    async def __call__(self, message: Message) -> None:
        self.started = self.started or message["type"] == "http.response.start"
        await self.send(message)


async def _watched(app_call: Any, receive: Receive, send: _Send) -> None:
    """Run the route; a client that leaves before the answer started cancels it.

    NOTE: a streamed route waits for its first chunk before it answers, without watching its
    client; a paired request waits there for its KV (decode side), so a router that gave up
    on the pair would leave it holding slots until the transfer timeout. Cancelling the route
    aborts the request (its stream's cleanup does)."""
    task = asyncio.ensure_future(app_call)
    watcher = asyncio.ensure_future(_disconnected(receive))
    gone = False
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not send.started:
            gone = True
            task.cancel()
        await task
    except asyncio.CancelledError:
        if not gone:  # we were cancelled (shutdown): so is the route
            task.cancel()
            raise
    finally:
        watcher.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


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

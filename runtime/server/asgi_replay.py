"""Hand an ASGI app a request body a middleware has already read."""
from __future__ import annotations

from starlette.types import Message, Receive


def replay(body: bytes, upstream: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then the client's own further messages (its
    disconnect), so the app downstream reads the request as if nothing had read it."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await upstream()

    return receive

"""Server-sent events: encoding, and a response that fails with a status code before its
first token and always closes its source (which aborts the engine requests behind it)."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import sse_error_event

try:
    import orjson
except ImportError:  # pragma: no cover - depends on the installation
    orjson = None  # type: ignore[assignment]

DONE = b"data: [DONE]\n\n"


def sse_data(obj: Any, may_hold_nonfinite: bool = True) -> bytes:
    """``data: {json}`` (OpenAI and SGLang-native style). Callers that know ``obj`` holds no
    non-finite float (no logprobs) pass ``may_hold_nonfinite=False``: orjson then writes it.

    NOTE: a native stream's chunk is cumulative (its text and output_ids so far), so at 256
    tokens ``json.dumps`` took ~70 us of the server loop per chunk against orjson's ~8 us: at
    a few thousand chunks a second, the largest single cost of the loop every stream shares.
    ``json.dumps`` stays where logprobs may be -inf or NaN (it writes them, orjson would write
    null) and for what orjson refuses."""
    if orjson is not None and not may_hold_nonfinite:
        try:
            return b"data: " + orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"
        except TypeError:  # an integer past 64 bits, a lone surrogate, an unknown type
            pass
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def sse_event(name: str, obj: Any) -> bytes:
    """``event: name`` + ``data: {json}`` (Anthropic style)."""
    return f"event: {name}\ndata: ".encode() + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


class SSEResponse(StreamingResponse):
    """A StreamingResponse that closes its body iterator however the response ends.

    NOTE: Starlette cancels the sending task on disconnect; if that happens while the
    generator is parked at a ``yield``, nothing would close it until garbage collection.
    Closing it here runs its ``finally`` (the engine aborts) right away.
    """

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._source = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose: Callable[[], Any] | None = getattr(self._source, "aclose", None)
            if aclose is not None:
                await aclose()


async def prefetch(source: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Pull ``source``'s first item now (so its errors raise in the handler, before any
    status line is sent) and return an iterator that replays it, then the rest."""
    try:
        first = await source.__anext__()
    except StopAsyncIteration:
        return _empty()
    except BaseException:
        await _close(source)
        raise
    return _replay(first, source)


async def _replay(first: Any, source: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        yield first
        async for item in source:
            yield item
    finally:
        await _close(source)


async def _empty() -> AsyncIterator[Any]:
    return
    yield  # pragma: no cover  (makes this an async generator)


async def _close(source: AsyncIterator[Any]) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()


async def guarded(events: AsyncIterator[bytes], protocol: str,
                  trailer: bytes | None = DONE) -> AsyncIterator[bytes]:
    """Pass ``events`` through; an error after the stream started becomes an in-stream error
    event (the status line is long gone), followed by ``trailer``."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        yield sse_error_event(protocol, exc)
        if trailer is not None:
            yield trailer
    finally:
        await _close(events)

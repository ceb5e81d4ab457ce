"""``RawResponse`` (the router's streamed-answer reader) against a scripted HTTP/1.1 peer on
loopback: chunked bodies split at any byte, several events in one read, content-length
bodies, and the failures the proxy relies on (httpx's types: a peer closing mid-answer, a
silent peer past the read timeout, nobody listening)."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from sgdsl.runtime.router.raw_response import _unframe, open_raw

EVENTS = [b"data: {\"a\": 1}\n\n", b"data: {\"b\": \"\xc3\xa9\"}\n\n", b"data: [DONE]\n\n"]


def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_unframe_takes_whole_chunks_and_keeps_the_rest():
    wire = _chunked(EVENTS)
    for cut in range(len(wire) + 1):  # whatever the first read held, nothing is lost
        first, rest, ended = _unframe(wire[:cut])
        more, _, ended = ([], b"", True) if ended else _unframe(rest + wire[cut:])
        assert b"".join(first + more) == b"".join(EVENTS) and ended


async def _serve(reply: list[bytes], pause_s: float = 0.0, seen: list | None = None):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        body = await reader.readexactly(length)
        if seen is not None:
            seen.append((head, body))
        for part in reply:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause_s)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _answer(reply: list[bytes], read_timeout_s: float = 30.0, pause_s: float = 0.0):
    seen: list = []
    server, url = await _serve(reply, pause_s, seen)
    async with server:
        resp = await open_raw(url, "POST", "/generate?x=1", b'{"stream": true}',
                              {"content-type": "application/json"}, 5.0, read_timeout_s)
        try:
            pieces = [p async for p in resp.aiter_bytes()]
        finally:
            await resp.aclose()
    return resp, pieces, seen


def test_a_chunked_stream_split_at_odd_bytes_arrives_whole():
    wire = _chunked(EVENTS)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    resp, pieces, seen = asyncio.run(_answer([head + wire[:7], wire[7:30], wire[30:]],
                                             pause_s=0.01))
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
    assert b"".join(pieces) == b"".join(EVENTS)
    request_head, body = seen[0]
    assert request_head.startswith(b"POST /generate?x=1 HTTP/1.1\r\n")
    assert b"connection: close" in request_head and body == b'{"stream": true}'


def test_a_content_length_answer_is_read_whole():
    resp, pieces, _ = asyncio.run(_answer(
        [b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 9\r\n"
         b"\r\n{\"e\": 1}\n"]))
    assert resp.status_code == 400 and pieces == [b'{"e": 1}\n']


def test_failures_raise_httpx_errors():
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    with pytest.raises(httpx.RemoteProtocolError):  # closed mid-answer
        asyncio.run(_answer([head + _chunked(EVENTS)[:20]]))
    with pytest.raises(httpx.ReadTimeout):  # silent past the read timeout
        asyncio.run(_answer([head, b""], read_timeout_s=0.2, pause_s=2.0))

    async def nobody() -> None:
        server, url = await _serve([])
        server.close()
        await server.wait_closed()
        await open_raw(url, "POST", "/", b"", {}, 5.0, 5.0)

    with pytest.raises(httpx.ConnectError):
        asyncio.run(nobody())

"""``RawResponse``: a worker's answer to a streamed request, read over a plain asyncio connection
for the router's SSE relay.

Relaying a stream through httpx cost the router's one event loop ~90 us per chunk on the dev
box (httpcore's pool and anyio stream wrappers, a cancel scope and h11's state machine per
read), a third of its ~270 us per relayed chunk; at a few thousand chunks a second (a PD decode
worker's whole batch, all through one router) that loop is the hop where inter-token gaps
queued up (``bench_pd.py --hop-times``). So a request with ``"stream": true`` goes out on its
own connection (``Connection: close``: no pool; a connect is far below a request's TTFT) in
one write, and the answer is read with asyncio's StreamReader: the head, then the body, with
the chunked framing undone over a buffer (one read may hold several events; they leave as one
piece). It offers what the proxy uses of ``httpx.Response`` (``status_code``, ``headers``,
``aiter_bytes``, ``aread``, ``text``, ``aclose``) and raises httpx's exception types, so
retries, read timeouts and a worker found down (``aclose`` from the health checker) behave as
before. Plain ``http://`` workers only; anything else stays on httpx.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

import httpx

READ_BYTES = 64 * 1024
HEAD_LIMIT = 64 * 1024  # a worker's status line and headers


class RawResponse:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 status_code: int, headers: dict[str, str], read_timeout_s: float) -> None:
        self._reader, self._writer = reader, writer
        self.status_code = status_code
        self.headers = headers  # lower-case names
        self._timeout = read_timeout_s
        self._content: bytes | None = None

    @property
    def text(self) -> str:
        return (self._content or b"").decode("utf-8", "replace")

    async def aread(self) -> bytes:
        if self._content is None:
            self._content = b"".join([piece async for piece in self.aiter_bytes()])
        return self._content

    async def aclose(self) -> None:
        self._writer.close()  # a read waiting on it ends (EOF): the relay reports the break

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it arrives, the chunked framing undone."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            async for piece in self._chunked():
                yield piece
        elif "content-length" in self.headers:
            length = int(self.headers["content-length"])
            if length:
                yield await self._read(self._reader.readexactly(length))
        else:
            while data := await self._read(self._reader.read(READ_BYTES)):
                yield data

    async def _chunked(self) -> AsyncIterator[bytes]:
        buf = b""
        while True:
            pieces, buf, ended = _unframe(buf)
            if pieces:
                yield pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if ended:
                return
            data = await self._read(self._reader.read(READ_BYTES))
            if not data:
                raise httpx.RemoteProtocolError("the worker closed the connection mid-answer")
            buf += data

    async def _read(self, awaitable: Any) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self._timeout)
        except asyncio.TimeoutError as exc:
            raise httpx.ReadTimeout(f"no data from the worker for {self._timeout} s") from exc
        except asyncio.IncompleteReadError as exc:
            raise httpx.RemoteProtocolError("the worker closed the connection mid-answer"
                                            ) from exc
        except asyncio.LimitOverrunError as exc:
            raise httpx.RemoteProtocolError(f"the worker's answer head exceeds {HEAD_LIMIT} "
                                            f"bytes") from exc
        except OSError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc


def _unframe(buf: bytes) -> tuple[list[bytes], bytes, bool]:
    """The complete chunks at the start of ``buf`` (HTTP/1.1 chunked framing), the rest, and
    whether the last (empty) chunk was among them."""
    pieces = []
    while (head := buf.find(b"\r\n")) >= 0:
        try:
            size = int(buf[:head].split(b";", 1)[0], 16)
        except ValueError as exc:
            raise httpx.RemoteProtocolError(f"bad chunk size line {buf[:head][:40]!r}") from exc
        if size == 0:
            return pieces, b"", True  # (trailers, which uvicorn never sends, are not read)
        end = head + 2 + size
        if len(buf) < end + 2:
            break
        pieces.append(buf[head + 2:end])
        buf = buf[end + 2:]
    return pieces, buf, False


async def open_raw(url: str, method: str, target: str, body: bytes, headers: dict[str, str],
                   connect_timeout_s: float, read_timeout_s: float) -> RawResponse:
    """Send the request to the worker at ``url`` (``target``: path and query) and read the
    answer's head; httpx.ConnectError/ConnectTimeout if the worker cannot be reached."""
    parts = urlsplit(url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port or 80, limit=HEAD_LIMIT),
            connect_timeout_s)
    except asyncio.TimeoutError as exc:
        raise httpx.ConnectTimeout(f"connecting to {url} took over {connect_timeout_s} s"
                                   ) from exc
    except OSError as exc:
        raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
    try:
        lines = [f"{method} {target} HTTP/1.1", f"host: {parts.netloc}",
                 *(f"{k}: {v}" for k, v in headers.items() if k.lower() not in _OWN),
                 f"content-length: {len(body)}", "connection: close", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1") + body)
        resp = RawResponse(reader, writer, 0, {}, read_timeout_s)
        head = await resp._read(reader.readuntil(b"\r\n\r\n"))
        resp.status_code, resp.headers = _parse_head(head)
        return resp
    except BaseException:  # failed, or cancelled (the worker was found down): no leak
        writer.close()
        raise


_OWN = frozenset({"host", "content-length", "connection", "transfer-encoding"})


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as exc:
        raise httpx.RemoteProtocolError(f"bad status line {lines[0][:80]!r}") from exc
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers

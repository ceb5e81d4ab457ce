"""The deployed router (``python -m sgdsl.runtime.router``) keeps an idle client connection open
longer than clients' own pools do (httpx drops its idle connections after 5 s).

Regression: at uvicorn's default 5 s keep-alive the router closed idle connections at the moment
an httpx pool (bench_router's, 256 connections) reused them; the request then met a reset
(``httpx.ReadError``) and the dp=4 benchmark died in its second policy's round.
"""
from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from typing import Iterator

import pytest

from sgdsl.runtime.server.thread_server import ThreadServer

from .flaky_worker import Script, make_app

HTTPX_POOL_EXPIRY_S = 5.0  # httpx.Limits' default keepalive_expiry


@pytest.fixture(scope="module")
def worker_url() -> Iterator[str]:
    server = ThreadServer(make_app(Script(name="w")))
    yield server.start()
    server.stop()


def start_router(worker_url: str, *flags: str) -> tuple[subprocess.Popen, tuple[str, int]]:
    cmd = [sys.executable, "-m", "sgdsl.runtime.router", "--worker-urls", worker_url,
           "--policy", "round_robin", "--host", "127.0.0.1", "--port", "0", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "listening on " in line:
            host, port = line.split("listening on http://")[1].split()[0].rsplit(":", 1)
            return proc, (host, int(port))
    proc.wait(timeout=30)
    raise RuntimeError("router did not start:\n" + "".join(seen))


def generate(sock: socket.socket) -> bytes:
    """One keep-alive POST /generate on ``sock``; its response (headers and body)."""
    body = b'{"text": "hello"}'
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data  # closed by the router
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the router has closed ``sock`` (an idle connection becomes readable only then)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""


def test_idle_connection_outlives_a_client_pool_expiry(worker_url):
    routers = [start_router(worker_url), start_router(worker_url, "--keep-alive-timeout-s", "1")]
    socks = []
    try:
        for _, address in routers:
            sock = socket.create_connection(address, timeout=60)
            socks.append(sock)
            assert generate(sock).startswith(b"HTTP/1.1 200")
        # Idle past the client pool's expiry (and a loaded box's lag): the default router must
        # still hold the connection, so a pool that reuses it then is answered, not reset.
        time.sleep(HTTPX_POOL_EXPIRY_S + 1.5)
        default, short = socks
        assert not closed_by_peer(default)
        assert generate(default).startswith(b"HTTP/1.1 200")
        # The flag is what decides: a 1 s router has closed its idle connection by now.
        assert closed_by_peer(short)
    finally:
        for sock in socks:
            sock.close()
        for proc, _ in routers:
            proc.terminate()
            proc.wait(timeout=60)

"""Server fixtures: the real server (embedded model, subprocess, once per session) and a fake
engine behind the same app served by uvicorn in a thread (once per module)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import httpx
import pytest

from sgdsl.runtime.server.thread_server import ThreadServer
from processes import listening_line

API_KEY = "test-key"
HERE = os.path.dirname(__file__)


@dataclass
class Served:
    url: str
    engine: Any = None  # the FakeEngine of an in-thread server
    proc: subprocess.Popen | None = None
    model: str = ""

    def client(self, timeout: float | None = 120, **kw: Any) -> httpx.Client:
        """``timeout=None``: no read timeout (pytest-timeout still ends a hung test)."""
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {API_KEY}"},
                            timeout=timeout, **kw)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[Served]:
    sys.path.insert(0, HERE)
    from fake_engine import FakeEngine

    from sgdsl.runtime.server.app import create_app
    from sgdsl.runtime.server.args import ServerArgs

    engine = FakeEngine(step_s=0.01)
    server = ThreadServer(create_app(engine, ServerArgs(api_key=API_KEY)))
    url = server.start()
    yield Served(url=url, engine=engine, model="fake-model")
    server.stop()


def start_real_server(*extra: str) -> Served:
    """``python -m sgdsl.runtime.server`` on a free loopback port with the embedded model."""
    cmd = [sys.executable, "-m", "sgdsl.runtime.server", "--host", "127.0.0.1", "--port", "0",
           "--api-key", API_KEY, "--num-threads", "1", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    line = listening_line(proc)
    return Served(url=line.split("listening on ")[1].split()[0], proc=proc,
                  model=line.rsplit("(model: ", 1)[1].rstrip(")\n"))


def stop_real_server(served: Served) -> int:
    """SIGTERM, wait for the drain and exit; returns the exit code."""
    assert served.proc is not None
    served.proc.send_signal(signal.SIGTERM)
    try:
        return served.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        raise


@pytest.fixture(scope="session")
def real_server() -> Iterator[Served]:
    served = start_real_server()
    yield served
    # The idle invariant must hold after everything the session threw at the server.
    with served.client() as client:
        integrity = client.get("/debug/check_idle_integrity")
    stop_real_server(served)
    assert integrity.status_code == 200, integrity.text

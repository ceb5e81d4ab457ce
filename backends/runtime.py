"""``Runtime``: starts the sgdsl server in a subprocess on loopback and acts as a
``RuntimeEndpoint`` to it (SGLang's ``sgl.Runtime``). ``shutdown()`` (or leaving a ``with``
block, or interpreter exit) stops the server and every process it started."""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from ._common import backend_error
from .runtime_endpoint import RuntimeEndpoint

SERVER_MODULE = "sgdsl.runtime.server"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_command(model: str | None, host: str, port: int, options: dict[str, Any]) -> list[str]:
    """``python -m sgdsl.runtime.server`` with each option as ``--name value`` (a True
    boolean as a bare flag, False/None left out)."""
    cmd = [sys.executable, "-m", SERVER_MODULE, "--host", host, "--port", str(port)]
    if model is not None:
        cmd += ["--model", str(model)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value not in (False, None):
            cmd += [flag, str(value)]
    return cmd


class Runtime(RuntimeEndpoint):
    """``Runtime(model=None, **server_options)``: model None = the embedded model."""

    name = "Runtime"

    def __init__(self, model: str | None = None, *, host: str = "127.0.0.1",
                 port: int | None = None, api_key: str | None = None,
                 startup_timeout_s: float = 300.0, **server_options: Any) -> None:
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        if api_key:
            server_options["api_key"] = api_key
        self._log = tempfile.NamedTemporaryFile(prefix="sgdsl-server-", suffix=".log", delete=False)
        self.process: subprocess.Popen | None = subprocess.Popen(
            server_command(model, host, self.port, server_options), stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True)  # own group: shutdown kills all
        atexit.register(self.shutdown)
        try:
            self._wait_ready(startup_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        super().__init__(self.url, api_key=api_key)

    @property
    def endpoint(self) -> RuntimeEndpoint:
        """SGLang spelling: the endpoint backend (this object)."""
        return self

    def log_tail(self, chars: int = 4000) -> str:
        with open(self._log.name, "rb") as f:
            return f.read()[-chars:].decode("utf-8", "replace")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll() if self.process else -1
            if code is not None:
                raise backend_error(self.name, RuntimeError(
                    f"server exited with code {code}:\n{self.log_tail()}"), what="start failed")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise backend_error(self.name, TimeoutError(
            f"server not healthy after {timeout_s:.0f}s:\n{self.log_tail()}"), what="start failed")

    def shutdown(self) -> None:
        """Stop the server's process group (idempotent)."""
        proc, self.process = self.process, None
        if proc is None:
            return
        atexit.unregister(self.shutdown)
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass

    async def close(self) -> None:
        await super().close()
        self.shutdown()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass

"""Serve an ASGI app with uvicorn in a background thread on a free loopback port.

For notebooks and tests that want the server and its Engine in the same process (uvicorn's
signal handlers are not installed off the main thread, so the caller stops it with ``stop``).
"""
from __future__ import annotations

import threading
import time
from typing import Any


class ThreadServer:
    """``start()`` returns the base URL once uvicorn listens; ``stop()`` exits and joins."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning") -> None:
        import uvicorn

        from .intake import http_protocol

        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                http=http_protocol(app))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout_s: float = 60.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start within {timeout_s:.0f} s")
            time.sleep(0.02)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

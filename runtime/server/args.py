"""Server options (everything that is not the engine's): one frozen dataclass."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerArgs:
    """Where and how the HTTP server listens. The engine's options live in ``EngineConfig``."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None  # required on every route but health when set
    cors_origins: tuple[str, ...] = ()  # CORS stays off unless origins are given
    graceful_timeout_s: float = 30.0  # how long SIGTERM waits for in-flight requests
    # NOTE: above uvicorn's 5 s, which equals httpx's pool expiry: a client reusing a connection
    # the server is closing at that moment gets a reset (the router's dp=4 ReadError, d7239d7)
    keep_alive_timeout_s: float = 75.0
    max_body_bytes: int = 32 * 1024 * 1024  # larger request bodies are answered 413
    log_level: str = "warning"
    tool_call_parser: str | None = None  # tool-call format; None: detected from the template
    reasoning_parser: str | None = None  # qwen3 | deepseek-r1: split <think> from the answer

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

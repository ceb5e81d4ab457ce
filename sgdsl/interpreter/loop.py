"""The background event loop behind the sync API, and the runner program bodies run in.

One daemon thread runs one loop for the whole process: every sync ``run``/``run_batch`` executes
its nodes there, so backend clients (httpx, the runtime engine) see a single loop.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

from sgdsl.interpreter.runner import BodyRunner

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_runner: BodyRunner | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="sgdsl-loop", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def body_runner() -> BodyRunner:
    """The threads that run program bodies for ``arun``/``run_batch``/streaming ``run``."""
    global _runner
    with _lock:
        if _runner is None:
            _runner = BodyRunner()
        return _runner


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the background loop and wait for it from this (non-loop) thread."""
    loop = background_loop()
    if _running_loop() is loop:
        raise RuntimeError("sgdsl: blocking call made on the interpreter's own loop; use the async API")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

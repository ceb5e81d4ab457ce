"""The background event loop behind the sync API, and the thread pool program bodies run in.

One daemon thread runs one loop for the whole process: every sync ``run``/``run_batch`` executes
its nodes there, so backend clients (httpx, the runtime engine) see a single loop.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pool: ThreadPoolExecutor | None = None

# NOTE: program bodies mostly block on s["x"]; a body thread costs little while it waits, so
# the pool is wide. Batches bound their own concurrency with a semaphore.
BODY_THREADS = 512


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


def body_pool() -> ThreadPoolExecutor:
    """Threads that run program bodies for ``arun``/``run_batch``."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(BODY_THREADS, thread_name_prefix="sgdsl-body")
        return _pool


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

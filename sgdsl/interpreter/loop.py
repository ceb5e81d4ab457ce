"""The background event loop behind the sync API, and the runner program bodies run in.

One daemon thread runs one loop for the whole process: every sync ``run``/``run_batch`` executes
its nodes there, so backend clients (httpx, the runtime engine) see a single loop.
"""
from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from typing import Any, Callable, Coroutine, TypeVar

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


class LoopCalls:
    """Calls onto one loop from other threads, with one loop wakeup per burst.

    ``call_soon_threadsafe`` writes to the loop's self-pipe on every call; the write releases
    the GIL and the woken loop thread takes it, so a body thread submitting gens back to back
    pays a thread switch per gen. Here the first call of a burst wakes the loop; later ones
    only queue until the loop has run the queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._queue: deque[tuple[Callable[..., Any], tuple]] = deque()
        self._scheduled = False

    def __call__(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._queue.append((fn, args))
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            queue, self._queue, self._scheduled = self._queue, deque(), False
        for fn, args in queue:
            fn(*args)


def threadsafe_future(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Future, Callable[[], None]]:
    """A future on ``loop`` and a function that any thread may call (more than once) to
    resolve it with None."""
    future = loop.create_future()

    def resolve() -> None:
        if not future.done():
            future.set_result(None)
    return future, lambda: loop.call_soon_threadsafe(resolve)


_calls: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopCalls]" = weakref.WeakKeyDictionary()


def loop_calls(loop: asyncio.AbstractEventLoop) -> LoopCalls:
    """The ``LoopCalls`` of ``loop`` (one per loop)."""
    calls = _calls.get(loop)
    if calls is None:
        with _lock:
            calls = _calls.get(loop)
            if calls is None:
                calls = _calls[loop] = LoopCalls(loop)
    return calls

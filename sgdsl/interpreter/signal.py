"""A change notification that both threads and coroutines (on any loop) can wait on.

The executor mutates a state on its loop and calls ``notify()``; program bodies wait in threads
(``wait_for``) and async iterators wait on their own loops (``async_wait_for``).
"""
from __future__ import annotations

import asyncio
import threading
from typing import Callable

from sgdsl.interpreter.runner import current_runner


class Signal:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self.version = 0

    def notify(self) -> None:
        with self._cond:
            self.version += 1
            self._cond.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block this thread until ``predicate()`` holds (False on timeout). On a body-runner
        thread, the runner is told first, so queued bodies move to another thread."""
        with self._cond:
            if predicate():
                return True
            runner = current_runner()
            if runner is None:
                return self._cond.wait_for(predicate, timeout)
            runner.before_block()
            try:
                return self._cond.wait_for(predicate, timeout)
            finally:
                runner.after_block()

    async def async_wait_for(self, predicate: Callable[[], bool]) -> None:
        """Await until ``predicate()`` holds."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._cond:
            self._waiters.add(entry)
        try:
            # NOTE: registered before the first check, so a notify between check and wait
            # leaves the event set and the wait returns at once.
            while not predicate():
                await entry[1].wait()
                entry[1].clear()
        finally:
            with self._cond:
                self._waiters.discard(entry)

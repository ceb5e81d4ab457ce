"""A change notification that both threads and coroutines (on any loop) can wait on.

The executor mutates a state on its loop and calls ``notify()``; program bodies wait in threads
(``wait_for``) and async iterators wait on their own loops (``async_wait_for``).
"""
from __future__ import annotations

import asyncio
import threading
from typing import Callable

from sgdsl.interpreter.runner import current_runner


_CREATE_LOCK = threading.Lock()


class Signal:
    def __init__(self) -> None:
        self._cond_: threading.Condition | None = None  # made on first wait (most never wait)
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._blocked = 0  # threads inside wait_for
        self.version = 0

    @property
    def _cond(self) -> threading.Condition:
        if self._cond_ is None:
            with _CREATE_LOCK:
                if self._cond_ is None:
                    self._cond_ = threading.Condition(threading.Lock())
        return self._cond_

    def notify(self) -> None:
        # NOTE: called once per executed node; most have nobody waiting. A waiting thread
        # counts itself (under the lock) before it checks its predicate, so a notify that
        # reads zero comes before that check, which then sees the change.
        self.version += 1
        if self._blocked:
            with self._cond:
                self._cond.notify_all()
        if self._waiters:
            for loop, event in list(self._waiters):
                loop.call_soon_threadsafe(event.set)

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block this thread until ``predicate()`` holds (False on timeout). On a body-runner
        thread, the runner is told first, so queued bodies move to another thread."""
        with self._cond:
            self._blocked += 1
            try:
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
            finally:
                self._blocked -= 1

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

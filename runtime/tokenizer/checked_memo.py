"""``CheckedMemo``: the request builder's remembered constraint checks, safe from any thread.

The Engine builds requests in its callers' threads (several threads may call one Engine) and,
for a JSON schema it has not checked yet, in a worker thread while the server's event loop
goes on (``check_pool.py``). An ``OrderedDict`` used as an LRU is not safe there: a ``get``
in one thread, an eviction in another, then ``move_to_end`` raises ``KeyError``. So every
read and write of the memo takes one lock, held only for the dict operations (a check takes
milliseconds to a third of a second, and runs outside it). A key being computed is
remembered as running: a second thread asking for it waits for that computation instead of
repeating it (a burst of requests sharing a new schema checks it once).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable, Hashable


class CheckedMemo:
    """A bounded LRU of key -> outcome, computed at most once at a time per key."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._memo: OrderedDict[Hashable, Any] = OrderedDict()
        self._running: dict[Hashable, Future] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._memo)

    def known(self, key: Hashable) -> bool:
        """Whether ``key``'s outcome is remembered (a lookup that does not refresh it)."""
        with self._lock:
            return key in self._memo

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``key``'s outcome: remembered, the one another thread is computing, or computed here
        (``compute()``, outside the lock) and remembered. ``compute``'s exception is raised
        to every thread waiting for it and nothing is remembered."""
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                return hit
            running = self._running.get(key)
            mine = running is None
            if mine:
                running = self._running[key] = Future()
        if not mine:
            return running.result()
        try:
            hit = compute()
        except BaseException as exc:
            with self._lock:
                del self._running[key]
            running.set_exception(exc)
            raise
        with self._lock:
            self._memo[key] = hit
            while len(self._memo) > self.size:
                self._memo.popitem(last=False)
            del self._running[key]
        running.set_result(hit)
        return hit

"""``BurstGate``: a caller about to issue many requests at once (``run_batch`` starting its
programs) holds its loop's gate, so the coalescers on that loop send the whole burst as one
call instead of whatever had arrived at each loop turn.

Without it, a batch's requests reach the engine as the interpreter's threads produce them: in
2-4 calls spread over the start phase, which the scheduler admits as as many prefill waves,
decoding the first arrivals in small batches while the rest come in. On the GPU (issue 29)
``run_batch`` on ``Local`` ran at 0.86-0.91x of the scheduler unconstrained at batch 256 where
``Engine.generate`` of the same list ran at 0.97-0.99x; on CPU the split batch took 54-60
forward steps where one call takes 39 (``benchmarks/bench_lang_local.py``).

The holder releases the gate when every request of its burst has been handed to the loop (the
interpreter: when no program body runs or waits in the queue). A hold also ends when no request
has joined it for ``QUIET_S`` (a body blocked outside the interpreter, a sleep or a tool's HTTP
call, would otherwise keep it open), and after ``MAX_HOLD_S`` in any case. Requests are only
ever delayed, never dropped or reordered within a caller.
"""
from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Callable

MAX_HOLD_S = 1.0  # 0 disables holding (every flush at the next loop turn, as before)
QUIET_S = 0.05  # a hold ends after this long without a new request


class BurstGate:
    """One per event loop: ``hold`` from the burst's owner (any thread), ``release`` from it
    on the loop, ``defer`` from the coalescers (on the loop). (It keeps no reference to its
    loop: the registry's weak key would never die.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holds = 0
        self._until = 0.0  # time.monotonic() past which holds no longer defer anything
        self.last_arrival = 0.0  # time.monotonic() of the last request (set by coalescers)
        self._waiting: list[Callable[[], None]] = []  # deferred flushes (loop thread only)
        self._timer: asyncio.TimerHandle | None = None

    def hold(self) -> None:
        """Start holding (any thread). Each hold needs one ``release``."""
        with self._lock:
            self._holds += 1
            now = time.monotonic()
            self.last_arrival = max(self.last_arrival, now)
            self._until = max(self._until, now + MAX_HOLD_S)

    def release(self) -> None:
        """End one hold. Call it on the loop, after the burst's requests were handed to it
        (e.g. through the same queue of loop calls), so the flush it triggers comes after them."""
        with self._lock:
            self._holds -= 1
            opened = self._holds == 0
        if opened:
            self._open()

    @property
    def held(self) -> bool:
        with self._lock:
            return self._holds > 0 and time.monotonic() < self._until

    def defer(self, flush: Callable[[], None]) -> bool:
        """On the loop: while held, keep ``flush`` until the gate opens (True); else False."""
        if not self.held:
            return False
        self._waiting.append(flush)
        if self._timer is None:
            self._arm()
        return True

    def _arm(self) -> None:
        """Check back when the hold would have been quiet for ``QUIET_S``."""
        now = time.monotonic()
        due = min(self.last_arrival + QUIET_S, self._until)
        self._timer = asyncio.get_running_loop().call_later(max(due - now, 0.0), self._check)

    def _check(self) -> None:
        self._timer = None
        now = time.monotonic()
        if now < min(self.last_arrival + QUIET_S, self._until):
            self._arm()  # requests still arriving
            return
        with self._lock:  # quiet or too long: this hold defers nothing more
            self._until = now
        self._open()

    def _open(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, []
        loop = asyncio.get_running_loop()
        for flush in waiting:  # NOTE: after the callbacks already queued (the last requests)
            loop.call_soon(flush)


_gates: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BurstGate]" = (
    weakref.WeakKeyDictionary())
_gates_lock = threading.Lock()


def burst_gate(loop: asyncio.AbstractEventLoop) -> BurstGate:
    """The gate of ``loop`` (made on first use)."""
    with _gates_lock:
        gate = _gates.get(loop)
        if gate is None:
            gate = _gates[loop] = BurstGate()
        return gate

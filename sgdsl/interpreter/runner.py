"""``BodyRunner``: the threads program bodies run in, used as few at a time as possible.

A program body is synchronous Python that mostly appends nodes and returns, but may block on
``s["x"]`` until a generation finishes. One thread per body (a plain thread pool) costs a thread
handoff per program, which dominates small programs in ``run_batch``. Here a thread runs queued
bodies back to back and hands the queue to another thread only when its body blocks:

- at once when the body waits on the interpreter (``Signal.wait_for`` calls ``before_block``);
- after ``HANDOFF_SECONDS`` without progress when it blocks elsewhere (``time.sleep``, a tool's
  HTTP call), noticed by a monitor thread that only wakes while bodies are queued.

Threads park when the queue is empty and are reused; they are daemons.

While bodies are queued (and for 50 ms after), and while a ``run_batch`` runs (``Batch``), the
interpreter's GIL switch interval drops from 5 ms to 0.25 ms (``fast_switching``): the thread
running bodies and the event loop turning their gens into requests then alternate finely, so the
first requests of a batch reach the engine while later bodies still run. With the default 5 ms, the loop waits for the whole start phase (measured on
an H200: 256 programs, 1.086x the engine's time vs 0.997x with 0.3 ms).
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Callable

HANDOFF_SECONDS = 0.001
MAX_THREADS = 1024
FAST_SWITCH_SECONDS = 0.00025
FAST_SWITCH_GRACE_SECONDS = 0.05

_local = threading.local()
_switch_lock = threading.Lock()
_switch_users = 0
_saved_switch: float | None = None


def fast_switching(on: bool) -> None:
    """Count one user in (``on``) or out of the fast GIL switch interval; the first one in
    lowers it, the last one out restores the value it found."""
    global _switch_users, _saved_switch
    with _switch_lock:
        if on:
            _switch_users += 1
            if _switch_users == 1:
                _saved_switch = sys.getswitchinterval()
                sys.setswitchinterval(min(_saved_switch, FAST_SWITCH_SECONDS))
        else:
            _switch_users -= 1
            if _switch_users == 0 and _saved_switch is not None:
                sys.setswitchinterval(_saved_switch)
                _saved_switch = None


def current_runner() -> "BodyRunner | None":
    """The runner whose thread this is (None outside runner threads)."""
    return getattr(_local, "runner", None)


class BodyRunner:
    def __init__(self, max_threads: int = MAX_THREADS, name: str = "sgdsl-body",
                 handoff_seconds: float = HANDOFF_SECONDS) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[Callable[[], None]] = deque()
        self._max_threads, self._name = max_threads, name
        self._handoff_seconds = handoff_seconds
        self._threads = 0   # alive
        self._parked = 0    # waiting for work
        self._waking = 0    # notified, not yet running
        self._active = 0    # running or about to look for work (not parked, not blocked)
        self._started = 0   # bodies taken from the queue: the monitor's heartbeat
        self.monitor_handoffs = 0  # times a queue stalled behind a body blocked elsewhere
        self._fast = False  # holds a fast_switching reference (the monitor releases it)
        self._kick = threading.Event()
        self._monitor: threading.Thread | None = None
        self._idle_callbacks: list[Callable[[], None]] = []

    def submit(self, body: Callable[[], None]) -> None:
        """Queue ``body`` (it must handle its own exceptions)."""
        with self._lock:
            self._queue.append(body)
            if not self._fast:
                self._fast = True
                fast_switching(True)
            if self._active + self._waking == 0:
                self._add_worker()
            if len(self._queue) == 1:
                self._ensure_monitor()
                self._kick.set()

    def when_idle(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once no body is queued or running (blocked bodies do not count):
        at once if so now, else on the thread whose body returns or blocks last. It runs with
        the runner's lock held, so it must be quick and must not call into the runner."""
        with self._lock:
            if not self._idle():
                self._idle_callbacks.append(callback)
                return
        callback()

    def _idle(self) -> bool:
        return not self._queue and self._active + self._waking == 0

    def _notify_idle(self) -> None:
        """Lock held: fire the ``when_idle`` callbacks if idle now."""
        if self._idle_callbacks and self._idle():
            callbacks, self._idle_callbacks = self._idle_callbacks, []
            for callback in callbacks:
                callback()

    def run_here(self, submit: Callable[[], None]) -> None:
        """Call ``submit`` (which queues bodies), then run queued bodies on this thread as one
        more worker until the queue is empty: a batch started from a plain thread (the caller
        of ``run_batch``, which would only wait anyway) wakes no worker while its bodies run
        without blocking. Worker threads (a batch started inside a body) just submit."""
        if current_runner() is not None:
            submit()
            return
        with self._lock:
            self._active += 1
        _local.runner = self
        try:
            submit()
            while True:
                with self._lock:
                    if not self._queue:
                        return
                    body = self._pop()
                body()
        finally:
            _local.runner = None
            with self._lock:
                self._active -= 1
                if self._queue and self._active + self._waking == 0:
                    self._add_worker()
                self._notify_idle()

    # ---- managed blocking (called by Signal.wait_for on runner threads) --------------------

    def before_block(self) -> None:
        with self._lock:
            self._active -= 1
            if self._queue and self._active + self._waking == 0:
                self._add_worker()
            self._notify_idle()

    def after_block(self) -> None:
        with self._lock:
            self._active += 1

    # ---- workers ----------------------------------------------------------------------------

    def _add_worker(self) -> None:
        """Get one more thread onto the queue (lock held): a parked one, else a new one."""
        if self._parked > self._waking:
            self._waking += 1
            self._wake.notify()
        elif self._threads < self._max_threads:
            self._threads += 1
            self._active += 1
            threading.Thread(target=self._work, name=f"{self._name}-{self._threads}",
                             daemon=True).start()

    def _pop(self) -> Callable[[], None]:
        """The next body (lock held)."""
        body = self._queue.popleft()
        self._started += 1
        return body

    def _work(self) -> None:
        _local.runner = self
        while True:
            with self._lock:
                while not self._queue:
                    self._active -= 1
                    self._parked += 1
                    self._notify_idle()
                    self._wake.wait()  # NOTE: no timeout: returns only when notified
                    self._parked -= 1
                    self._waking -= 1
                    self._active += 1
                body = self._pop()
            try:
                body()
            except BaseException:  # noqa: BLE001 - bodies report their own errors; an
                pass  # interrupt only reaches the main thread, which is never a worker

    # ---- the monitor: bodies blocked outside the interpreter ----------------------------------

    def _ensure_monitor(self) -> None:
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._watch, name=f"{self._name}-monitor",
                                             daemon=True)
            self._monitor.start()

    def _watch(self) -> None:
        while True:
            self._kick.wait()
            with self._lock:
                idle = not self._queue
                if idle:
                    self._kick.clear()
                seen = self._started
            if idle:
                self._after_burst()
                continue
            time.sleep(self._handoff_seconds)
            with self._lock:
                if self._queue and self._started == seen:
                    self.monitor_handoffs += 1
                    self._add_worker()  # the queue made no progress: its threads are stuck

    def _after_burst(self) -> None:
        """The queue is empty: keep fast switching for ``FAST_SWITCH_GRACE_SECONDS`` more (the
        loop is still turning the last bodies' gens into requests), then restore it unless
        new bodies came."""
        if self._kick.wait(FAST_SWITCH_GRACE_SECONDS):
            return
        with self._lock:
            if not self._queue and self._fast:
                self._fast = False
                fast_switching(False)

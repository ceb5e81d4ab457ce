"""``Batch``: the programs of one ``run_batch``/``arun_batch``, started at most ``limit`` at a
time, with their states handed back in input order.

Completion comes from each run's ``when_done`` callback (no coroutine or future per program):
the sync caller is woken only when the state it is waiting for is done, and the async caller
once, when all are.

While the first programs start, the batch holds its loop's ``BurstGate``: their requests reach
the backend as one call (one prefill wave at the engine, as ``Engine.generate`` of the list),
not in the 2-4 pieces the interleaved threads would otherwise produce. The hold ends when no
body runs any more (each has returned or waits on a result), through the loop's call queue, so
it comes after the last body's nodes. The garbage collector is held off from the start to the
first finished program (``gc_pause.py``: its collections cost that phase 12-130 ms at 256).
"""
from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Callable

from sgdsl.backends.burst import BurstGate
from sgdsl.interpreter import gc_pause
from sgdsl.interpreter.loop import loop_calls, threadsafe_future
from sgdsl.interpreter.runner import BodyRunner, current_runner, fast_switching

if TYPE_CHECKING:
    from sgdsl.state import ProgramState

MakeState = Callable[[dict[str, Any]], "ProgramState"]
StartBody = Callable[["ProgramState", dict[str, Any]], None]


class Batch:
    def __init__(self, kwargs_list: list[dict[str, Any]], make_state: MakeState,
                 start_body: StartBody, limit: int | None = None,
                 on_finish: Callable[[], None] | None = None,
                 burst: tuple[BodyRunner, asyncio.AbstractEventLoop, BurstGate] | None = None
                 ) -> None:
        """``burst``: the runner the bodies run on, the programs' loop and its gate, held
        while the first programs start (None: no hold)."""
        self._items = [dict(kwargs) for kwargs in kwargs_list]
        self._make, self._start = make_state, start_body
        self._limit = limit
        self.states: list["ProgramState | None"] = [None] * len(self._items)
        self._done = [False] * len(self._items)
        self._count = self._next = 0
        self._waiting = -1
        self._cancelled = False
        self._cond = threading.Condition()
        self._on_all: Callable[[], None] | None = None
        self._on_finish = on_finish  # e.g. a progress bar's update
        self._fast = False  # holds a fast_switching reference
        self._burst = burst
        self._holding = False  # holds the gate of ``burst``
        self._resume_gc: Callable[[], None] | None = None  # holds the collector off (burst)
        # NOTE: its own lock: _end_burst runs under the runner's lock, which wait() takes
        # while holding _cond
        self._burst_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def start(self) -> None:
        """Start the first ``limit`` programs. Until the batch is done (or cancelled) the GIL
        switch interval is the body runner's fast one: the threads building requests and the
        ones handling results then alternate finely instead of in 5 ms slices."""
        if self._items:
            self._fast = True
            fast_switching(True)
        first = min(self._limit or len(self._items), len(self._items))
        if first > 1 and self._burst is not None:
            self._holding = True
            self._burst[2].hold()
            self._pause_gc()
        try:
            for _ in range(first):
                self._start_next()
        except BaseException:
            self._end_burst()
            self._end_gc_pause()
            raise
        if self._holding:  # NOTE: after the submits, so the runner is not idle before them
            self._burst[0].when_idle(self._end_burst)

    def wait(self, i: int) -> "ProgramState":
        """Block until program ``i`` is done; its state."""
        with self._cond:
            if not self._done[i]:
                self._waiting = i
                runner = current_runner()  # run_batch called inside a program body
                if runner is not None:
                    runner.before_block()
                try:
                    self._cond.wait_for(lambda: self._done[i])
                finally:
                    if runner is not None:
                        runner.after_block()
            state = self.states[i]
        assert state is not None
        return state

    async def wait_all(self) -> list["ProgramState"]:
        """Await every program (for ``arun_batch``); cancelling cancels them all."""
        future, resolve = threadsafe_future(asyncio.get_running_loop())
        with self._cond:
            self._on_all = resolve
            finished = self._count == len(self._items)
        if not finished:
            try:
                await future
            except asyncio.CancelledError:
                self.cancel()
                raise
        return [s for s in self.states if s is not None]

    def cancel(self) -> None:
        """Abort the started programs; start no more."""
        with self._cond:
            self._cancelled = True
        self._release_fast()
        self._end_burst()
        self._end_gc_pause()
        for state in self.states:
            if state is not None:
                state.cancel()

    # ---- internals ----------------------------------------------------------------------------

    def _start_next(self) -> None:
        with self._cond:
            if self._next >= len(self._items) or self._cancelled:
                return
            i = self._next
            self._next += 1
        state = self._make(self._items[i])
        self.states[i] = state
        state.stream_executor.run.when_done(lambda: self._finished(i))
        self._start(state, self._items[i])

    def _finished(self, i: int) -> None:
        with self._cond:
            self._done[i] = True
            self._count += 1
            if i == self._waiting:
                self._cond.notify_all()
            on_all = self._on_all if self._count == len(self._items) else None
        self._end_gc_pause()  # the batch is at the engine: collections now run beside it
        if self._on_finish is not None:
            self._on_finish()
        if self._count == len(self._items):
            self._release_fast()
        if on_all is not None:
            on_all()
        if self._limit:
            self._start_next()

    def _end_burst(self) -> None:
        """Release the gate once, on the loop, behind the calls the bodies queued there."""
        with self._burst_lock:
            release, self._holding = self._holding, False
        if release:
            runner, loop, gate = self._burst
            try:
                loop_calls(loop)(gate.release)
            except RuntimeError:  # the loop is closed: nothing left to flush
                pass

    def _pause_gc(self) -> None:
        """Hold the collector off until the first program finishes (``_end_gc_pause``), or
        ``gc_pause.MAX_PAUSE_S`` on the batch's loop."""
        self._resume_gc = gc_pause.pause_gc()
        loop = self._burst[1]
        try:
            loop_calls(loop)(lambda: loop.call_later(gc_pause.MAX_PAUSE_S, self._end_gc_pause))
        except RuntimeError:  # the loop is closed: nothing will run, so nothing to wait for
            self._end_gc_pause()

    def _end_gc_pause(self) -> None:
        with self._burst_lock:
            resume, self._resume_gc = self._resume_gc, None
        if resume is not None:
            resume()

    def _release_fast(self) -> None:
        with self._cond:
            release, self._fast = self._fast, False
        if release:
            fast_switching(False)

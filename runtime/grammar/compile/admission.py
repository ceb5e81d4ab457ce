"""Admission control of the grammar compile queue: how long a new compile would wait for a worker,
and the measurements behind it (also what ``/metrics`` shows of the compile pipeline).

A compile's deadline (``grammar_compile_timeout_s``) bounds the compile itself, from when a
worker starts it; the wait before that is bounded here instead. A compile is admitted when the
queue ahead of it is expected to drain within ``grammar_compile_max_wait_s``: (compiles queued
and running beyond the workers, plus this one) x the typical recent service time (a worker's
compile plus loading its result here) / workers. Otherwise the request is refused with a
retryable ``GrammarQueueFullError`` carrying a retry-after (the server's 503 ``Retry-After``),
never an invalid-request error: nothing is wrong with the request.

The typical service time is the median of the last ``_WINDOW`` compiles (a few slow schemas do
not make every later one look slow), ``_PRIOR_S`` until ``_MIN_SAMPLES`` compiles were seen.
"""
from __future__ import annotations

import bisect
import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ...errors import GrammarQueueFullError

_WINDOW = 64
_MIN_SAMPLES = 4
_PRIOR_S = 0.1  # a real-world schema's compile and load, until some were measured
# Histogram buckets (seconds): compiles take milliseconds to the deadline's tens of seconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass
class Histogram:
    """A Prometheus-style histogram: cumulative-ready bucket counts, sum and count."""

    buckets: tuple[float, ...] = BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds
        self.count += 1

    def snapshot(self) -> dict:
        """Plain JSON data for ``Engine.stats()``: the finite upper bounds with cumulative
        counts (the +Inf bucket's is ``count``), the sum and the count."""
        cumulative, running = [], 0
        for n in self.counts[:-1]:
            running += n
            cumulative.append(running)
        return {"le": list(self.buckets), "cumulative": cumulative, "sum": self.total,
                "count": self.count}


class CompileAdmission:
    """Queue-wait estimates and the compile pipeline's measurements; thread-safe (the pool's
    slot threads record, the scheduler thread admits and reads)."""

    def __init__(self, workers: int, max_wait_s: float) -> None:
        self.workers = workers
        self.max_wait_s = max_wait_s
        self._lock = threading.Lock()
        self._recent: deque[float] = deque(maxlen=_WINDOW)
        self.queued = 0  # compiles waiting for a worker
        # the futures of compiles a worker has (or whose result is loading here): one counts
        # until its future is done, so a request served just now sees its compile gone
        self._running: set = set()
        self.rejected = 0
        self.wait = Histogram()  # submit -> a worker starts it
        self.compile = Histogram()  # in the worker
        self.load = Histogram()  # its result made usable here (backend.receive)

    def typical_s(self) -> float:
        with self._lock:
            recent = list(self._recent)
        return statistics.median(recent) if len(recent) >= _MIN_SAMPLES else _PRIOR_S

    def expected_wait_s(self) -> float:
        """Seconds a compile submitted now would wait for a worker."""
        with self._lock:
            running = sum(not f.done() for f in self._running)
        ahead = self.queued + running - self.workers + 1
        return max(0.0, ahead) * self.typical_s() / self.workers

    def admit(self, field_name: str) -> None:
        """Count a new compile as queued, or raise ``GrammarQueueFullError`` if its expected
        wait is past the limit."""
        wait = self.expected_wait_s()
        if wait > self.max_wait_s:
            self.rejected += 1
            raise GrammarQueueFullError(
                f"the grammar compile queue is full: this {field_name} would wait about "
                f"{wait:.0f} s for one of {self.workers} compile workers (the limit is "
                f"{self.max_wait_s:g} s, grammar_compile_max_wait_s); retry later",
                retry_after=math.ceil(wait - self.max_wait_s))
        with self._lock:
            self.queued += 1

    def full(self, field_name: str, max_queued: int) -> GrammarQueueFullError:
        """The error for a queue at its length bound (``grammar_compile_queue``)."""
        with self._lock:
            self.queued -= 1
            self.rejected += 1
        return GrammarQueueFullError(
            f"the grammar compile queue is full: {max_queued} compiles wait for "
            f"{self.workers} compile workers (grammar_compile_queue); retry later",
            retry_after=math.ceil(max(1.0, self.expected_wait_s())))

    def started(self, future: Any, waited_s: float) -> None:
        """A worker took the compile whose result ``future`` will hold."""
        with self._lock:
            self.queued -= 1
            self._running.add(future)
            self.wait.observe(waited_s)

    def dropped(self) -> None:
        """A queued compile left without running (its requests gave up, or shutdown)."""
        with self._lock:
            self.queued -= 1

    def finished(self, future: Any, compile_s: float | None, load_s: float | None,
                 service_s: float) -> None:
        """A started compile is over (``compile_s``/``load_s`` None: that stage did not run)."""
        with self._lock:
            self._running.discard(future)
            self._recent.append(service_s)
            if compile_s is not None:
                self.compile.observe(compile_s)
            if load_s is not None:
                self.load.observe(load_s)

    def stats(self) -> dict:
        """Gauges and histograms for ``Engine.stats()`` and ``/metrics``."""
        with self._lock:
            return {"grammar_compile_queue_depth": self.queued,
                    "grammar_compile_running": sum(not f.done() for f in self._running),
                    "grammar_compile_workers": self.workers,
                    "grammar_compile_rejected_busy": self.rejected,
                    "grammar_compile_wait_seconds": self.wait.snapshot(),
                    "grammar_compile_seconds": self.compile.snapshot(),
                    "grammar_compile_load_seconds": self.load.snapshot()}

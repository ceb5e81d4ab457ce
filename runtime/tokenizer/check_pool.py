"""``CheckPool``: a new JSON schema's checks run in a worker thread, not on the caller's loop.

The first request of a (JSON schema, max_new_tokens) pair pays the request builder's check
(the JSON Schema meta-schema in jsonschema, pure Python; the size limits; the vacuous bounds):
5.8 ms for a 5-field schema, ~0.3 s for a large one (benchmarks/RESULTS.md, req-host). A
server builds its requests on its event loop, which meanwhile parsed, routed and answered
nothing for anyone else. An Engine call made on a loop now asks the builder which of its
schemas are unchecked (``RequestBuilder.unchecked``: a dict lookup, nothing for a request
without a schema or with a remembered one, which keep building on the loop with no thread
hop), checks those here, and builds once they are remembered: the request's own hand-off
waits for its check while the loop serves the others. Requests of one loop waiting for the
same schema share one check and resume in the same loop turn, so a burst sharing a new schema
still reaches the submitter (runtime/submitter.py) together. The outcome, a bad schema's
error included, is the builder's memo's, so the error is the one the loop would have raised.
A flood of distinct new schemas is bounded: past ``max_queued`` checks (the Engine: ``grammar_compile_queue``) waiting or
running, a request that needs one more gets the retryable ``GrammarQueueFullError`` (503 with
Retry-After), never a 400, while requests with no schema or a known one go on.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import GrammarQueueFullError

# NOTE: more than one, so a huge schema's check does not hold a small one's up; few, as the
# checks are pure Python (the GIL): more threads would only take more of the loop's turns.
CHECK_WORKERS = 2
# NOTE: the default only; the Engine passes its ``grammar_compile_queue`` (512): a check precedes
# its schema's compile, so a burst the compile queue admits (issue 29: 150 distinct schemas at
# once) must not be refused here first. A check takes ~5 ms (a small schema) to ~2 s (a 64 KiB
# one) on a 2-core box; identical schemas share one check; memory: <= 64 KiB a pending schema.
MAX_QUEUED_CHECKS = 512


class CheckPool:
    """One per Engine: ``waiting(sampling_params)`` on a caller loop."""

    def __init__(self, builder: Any, workers: int = CHECK_WORKERS,
                 max_queued: int = MAX_QUEUED_CHECKS) -> None:
        self.builder = builder
        self.workers = workers
        self.max_queued = max_queued
        self._lock = threading.Lock()  # the counts below: callers' loops are several threads
        self.queued = 0  # checks submitted and not finished
        self._spent_s = 0.0  # seconds the finished checks took (for Retry-After)
        self.rejected = 0  # requests refused with GrammarQueueFullError
        # NOTE: its threads start at the first check (ThreadPoolExecutor starts them lazily)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="sgdsl-schema-check")
        # caller loop -> memo key -> the check running for that loop's requests
        self._running: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.checks = 0  # checks finished here (stats: offloop_schema_checks)

    def waiting(self, sampling_params: Any) -> asyncio.Future | None:
        """None when every schema of ``sampling_params`` is remembered (build now, on the
        loop); else a future of the running loop, done once they all are. Never cancel it:
        it may be shared (wrap it in ``asyncio.shield`` to await it)."""
        todo = self.builder.unchecked(sampling_params)
        if not todo:
            return None
        loop = asyncio.get_running_loop()
        running = self._running.get(loop)
        if running is None:
            running = self._running[loop] = {}
        jobs = []
        for memo, sp in todo:
            job = running.get(memo)
            if job is None:
                self._admit()
                job = running[memo] = loop.run_in_executor(self._pool, self._check, memo, sp)
                job.add_done_callback(lambda j, memo=memo: _forget(running, memo, j))
            jobs.append(job)
        return jobs[0] if len(jobs) == 1 else asyncio.gather(*jobs)

    def _admit(self) -> None:
        with self._lock:
            if self.queued >= self.max_queued:
                self.rejected += 1
                mean_s = self._spent_s / self.checks if self.checks else 1.0
                raise GrammarQueueFullError(
                    f"{self.queued} new json_schema checks are waiting for {self.workers} "
                    "check threads; retry later",
                    retry_after=math.ceil(self.queued * mean_s / self.workers))
            self.queued += 1

    def _check(self, memo: tuple, sp: Any) -> None:
        start = time.perf_counter()
        try:
            self.builder.check(memo, sp)
        finally:
            with self._lock:
                self.queued -= 1
                self.checks += 1
                self._spent_s += time.perf_counter() - start

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _forget(running: dict, memo: tuple, job: asyncio.Future) -> None:
    if running.get(memo) is job:
        del running[memo]
    if not job.cancelled():
        job.exception()  # retrieved: its waiters may all have gone away


def copy_outcome(outer: asyncio.Future, inner: asyncio.Future) -> None:
    """``inner``'s outcome, copied to ``outer`` (unless the caller stopped waiting): the future
    a caller got for a request started once its check was done (``Engine._start_after``)."""
    if outer.done():
        return
    if inner.cancelled():
        outer.cancel()
    elif inner.exception() is not None:
        outer.set_exception(inner.exception())  # type: ignore[arg-type]
    else:
        outer.set_result(inner.result())

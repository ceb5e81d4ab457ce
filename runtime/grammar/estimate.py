"""EstimateJobs: completion-length estimates searched on a helper thread.

The forced-completion tracker (completion.py) measures each constrained request a few times
before its budget nears its end; such a measurement far from the end is only an estimate that
schedules the next one, yet a real search costs 1-5 ms of the scheduler thread (a bitmask fill
of the whole vocabulary and tens of accept/rollback calls per expansion), on the path to the
next sampling launch. Requests measure in bursts (a batch of one schema reaches the same
states together), so a step with searches left the device waiting for its sampling launch
while other steps left the host waiting for the device (measured at 32 rows on the H100 host:
both waits, 1-4 ms a step each).

Here the search runs on a copy of the request's matcher (``Grammar.copy``) on one helper
thread, which gets the GIL while the scheduler thread waits for the device; the tracker takes
the answer ``COLLECT_AFTER`` steps later (waiting for it if need be), as measured at the output
length it was asked at. The answer cache stays the scheduler thread's (answers are stored when
taken), so what each request sees and when it is forced never depends on thread timing.
Only grammars whose native calls release the GIL (``thread_safe_batch``) go here, only while
the budget is far from its end, and the measurement that forces is always made on the
scheduler thread from the request's own state.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
from dataclasses import dataclass
from typing import Hashable

from .base import Grammar
from .shortest import Completion, CompletionSearch

logger = logging.getLogger(__name__)

COLLECT_AFTER = 3  # steps between asking and taking an answer (the search's time to run)


@dataclass(frozen=True)
class Pending:
    """A search out on the helper thread for one request: ``grammar`` is a copy of its
    matcher after ``at`` output tokens (idle: the job searches a copy of its own), ``keys``
    that state's cache keys. ``shared``: the job was asked for another request in the same
    state ("full" key: its answer counts as this one's) or one whose newest parse step is the
    same ("local": its answer is replayed on ``grammar`` first); None: asked for this one."""

    job: cf.Future
    grammar: Grammar
    at: int
    keys: tuple[Hashable, ...]
    shared: str | None = None

    def answer(self) -> Completion | None:
        """Wait for the search; None if it found nothing or failed (then logged)."""
        try:
            return self.job.result()
        except Exception:  # noqa: BLE001 - an estimate: the tracker searches itself next
            logger.exception("completion estimate failed")
            return None


class EstimateJobs:
    """One helper thread running ``CompletionSearch.fresh`` (then ``search_deep`` if asked)
    on copies of matchers; requests asking from one state before its answer is taken share
    one job."""

    def __init__(self, search: CompletionSearch) -> None:
        self._search = search
        self._pool: cf.ThreadPoolExecutor | None = None
        self._inflight: dict[Hashable, cf.Future] = {}  # cache key -> job not stored yet
        self.submitted = 0  # searches sent to the helper thread

    def submit(self, grammar: Grammar, at: int, keys: tuple[Hashable, ...],
               deep: bool) -> Pending | None:
        """Search from a copy of ``grammar`` (made here: the caller may advance its own right
        away); None if the grammar's native calls hold the GIL (nothing would run beside)."""
        if not grammar.thread_safe_batch:
            return None
        copy = grammar.copy()
        for kind, key in zip(("full", "local"), keys):
            job = self._inflight.get(key)
            if job is not None:
                return Pending(job, copy, at, keys, kind)
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="sgdsl-completion")
        self.submitted += 1
        job = self._pool.submit(self._run, grammar.copy(), at, deep)
        for key in keys:
            self._inflight[key] = job
        return Pending(job, copy, at, keys)

    def taken(self, pending: Pending) -> None:
        """``pending``'s answer is in the cache (or was none): later asks search anew."""
        for key in pending.keys:
            if self._inflight.get(key) is pending.job:
                del self._inflight[key]
        if len(self._inflight) > 4096:  # requests that left before taking theirs
            self._inflight = {k: j for k, j in self._inflight.items() if not j.done()}

    def _run(self, grammar: Grammar, at: int, deep: bool) -> Completion | None:
        found = self._search.fresh(grammar)
        if found is None and deep:
            found = self._search.search_deep(grammar, at)
        return found

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._inflight.clear()

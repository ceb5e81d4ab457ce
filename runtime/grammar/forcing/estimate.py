"""EstimateJobs: completion-length estimates searched in a worker process.

The forced-completion tracker (completion.py) measures each constrained request a few times
before its budget nears its end; such a measurement far from the end is only an estimate that
schedules the next one, yet a real search costs 1-5 ms (a bitmask fill of the whole vocabulary
and tens of accept/rollback calls per expansion, in Python), on the path to the next sampling
launch. Requests measure in bursts (a batch of one schema reaches the same states together).

Here the search runs in the estimate worker process (``estimate_process.py``; a helper thread
of this process held the GIL the scheduler thread needed for its launches) from a fresh matcher
advanced by the request's output; the tracker takes the answer ``COLLECT_AFTER`` steps later,
as measured at the output length it was asked at. Where the worker has not answered by then
(starting, behind, dead) the same search runs here on a copy of the matcher kept at submit, so
what each request sees and when it is forced never depends on the worker's timing. The answer
cache stays the scheduler thread's (answers are stored when taken); only estimates far from the
budget's end go out, and the measurement that forces is always made from the request's own
state on the scheduler thread.
"""
from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from ..base import Grammar
from .estimate_process import EstimateProcess
from .estimate_worker import EstimateInit
from .shortest import Completion, CompletionSearch

COLLECT_AFTER = 3  # steps between asking and taking an answer (the search's time to run)


@dataclass(frozen=True)
class Pending:
    """A search out in the worker for one request: ``grammar`` is a copy of its matcher after
    ``at`` output tokens (searched here if the worker does not answer), ``keys`` that state's
    cache keys, ``deep``: ``search_deep`` after a failed search. ``shared``: the job was asked
    for another request in the same state ("full" key: its answer counts as this one's) or one
    whose newest parse step is the same ("local": its answer is replayed on ``grammar``
    first); None: asked for this one."""

    job: cf.Future
    grammar: Grammar
    at: int
    keys: tuple[Hashable, ...]
    deep: bool
    shared: str | None = None


class EstimateJobs:
    """Searches in the estimate worker; requests asking from one state before its answer is
    taken share one job."""

    def __init__(self, search: CompletionSearch, backend: Any, disk: Any = None) -> None:
        """``disk``: the engine's ``GrammarDiskCache`` (the worker loads grammars from it
        rather than compiling them again), or None."""
        self._search = search
        init = EstimateInit(backend.spec, search.tokenizer, search.vocab_size,
                            tuple(search.stop_ids), search.max_expansions, search.deep_seconds,
                            disk)
        self.worker = EstimateProcess(init)
        self._inflight: dict[Hashable, cf.Future] = {}  # cache key -> job not stored yet
        self.submitted = 0  # searches sent to the worker
        self.answered = 0  # answers taken from the worker (a shared job's counted per taker)
        self.searched_here = 0  # taken unanswered: searched in this process

    def prepare(self, key: Any) -> None:
        """A request's grammar, of ``GrammarKey`` ``key``, compiled: the worker (started in
        the background if need be) compiles its own copy while the request waits."""
        self.worker.prepare(key)

    def submit(self, grammar: Grammar, output_ids: Sequence[int], keys: tuple[Hashable, ...],
               deep: bool, key: Any) -> Pending | None:
        """Search from ``grammar``'s state, which ``output_ids`` reached from the start of
        the grammar of ``GrammarKey`` ``key``; None: search here now (the worker is dead or
        full, or the grammar is not searched there)."""
        # NOTE: outlines grammars are measured here as before this worker (then for the GIL):
        # taking their estimates late cut an output in test_completion's new-array-item test
        # (an item opened after the estimate; not understood yet), xgrammar's never
        if not grammar.thread_safe_batch or grammar.num_accepted != len(output_ids):
            return None
        at = len(output_ids)
        for kind, cache_key in zip(("full", "local"), keys):
            job = self._inflight.get(cache_key)
            if job is not None:
                return Pending(job, grammar.copy(), at, keys, deep, kind)
        job = self.worker.submit(key, output_ids, deep)
        if job is None:
            return None
        self.submitted += 1
        for cache_key in keys:
            self._inflight[cache_key] = job
        return Pending(job, grammar.copy(), at, keys, deep)

    def answer(self, pending: Pending) -> Completion | None:
        """The worker's answer, or the same search run here when it has none."""
        answered, found = self.worker.outcome(pending.job)
        if answered:
            self.answered += 1
            return found
        self.searched_here += 1
        found = self._search.fresh(pending.grammar)
        if found is None and pending.deep:
            found = self._search.search_deep(pending.grammar, pending.at)
        return found

    def taken(self, pending: Pending) -> None:
        """``pending``'s answer is in the cache (or was none): later asks search anew."""
        for key in pending.keys:
            if self._inflight.get(key) is pending.job:
                del self._inflight[key]
        if len(self._inflight) > 4096:  # requests that left before taking theirs
            self._inflight = {k: j for k, j in self._inflight.items() if not j.done()}

    def shutdown(self) -> None:
        self.worker.shutdown()
        self._inflight.clear()

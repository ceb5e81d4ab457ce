"""MaskPrefetch: a decode step's bitmask, accepted-and-filled on a helper thread while the
scheduler thread works on the rest of the step.

With overlap scheduling a decode step's forward is queued before the previous step's tokens are
read; those tokens must advance the matchers (accept) before the step's bitmask can be filled,
and the sampling launch waits for the bitmask. Accept and fill are native code that releases
the GIL (xgrammar), so for the rows whose request needs nothing else from its matcher before
the accept (no forced completion being applied, a native grammar) both run on a helper thread,
while the scheduler thread handles the other rows. Once the job is done, handed rows are
checked for a jump-forward; completion measurements due on them are made after the sampling
launch (``GrammarManager.plan_deferred``), or before the jump on rows that jump (``_decide``). Measured on the H100 host at 256 rows: accept 3.3 ms + fill
3.0 ms per step against a 9.8 ms forward.

While the job runs, its matchers belong to it: the scheduler thread must not touch them (a fill
walks the matcher's parser forward and back), which is why only rows with nothing else to do
this step are handed over (``GrammarManager.after_sample`` decides). The job reports what the
scheduler thread needs to know of each row (``RowFacts``: accepted, terminated, completed, the
jump-forward text) as soon as the accepts are done, then fills the rows that do not jump; so
the scheduler thread applies the jump-forwards while the fill runs, and never fills a row whose
token the jump drops.
"""
from __future__ import annotations

import concurrent.futures as cf
from typing import Any, NamedTuple, Sequence

import torch

from .base import accept_token_grouped, allocate_bitmask, fill_bitmask_grouped, open_rows

_EXECUTOR: cf.ThreadPoolExecutor | None = None


class RowFacts(NamedTuple):
    """A handed row's matcher after the job's accept (read on the helper thread: the scheduler
    thread may not touch a matcher while it is filled)."""

    ok: bool  # the token was accepted
    terminated: bool
    completed: bool
    jump: str  # the jump-forward text ("" if none or not asked); such a row is not filled


def _facts(grammar: Any, ok: bool, jump: bool) -> RowFacts:
    if not ok:
        return RowFacts(False, False, False, "")
    terminated = grammar.is_terminated()
    text = grammar.jump_forward_string() if jump and not terminated else ""
    return RowFacts(True, terminated, not terminated and grammar.is_completed(), text)


def _executor() -> cf.ThreadPoolExecutor:
    # NOTE: one thread: the job itself fans out (xgrammar's fill threads, the accept chunks).
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = cf.ThreadPoolExecutor(1, thread_name_prefix="sgdsl-mask-prefetch")
    return _EXECUTOR


class MaskPrefetch:
    """The bitmask of one decode step (rows aligned with its requests) and the helper-thread job
    that accepts the handed-over rows' newest tokens and fills their rows."""

    def __init__(self, reqs: Sequence[Any], vocab_size: int, pin: bool = False) -> None:
        self.rows = {id(r): i for i, r in enumerate(reqs)}
        # NOTE: rows undefined until filled here or opened by ``settle``
        # (setting 4 MB to -1 each step at 256 rows cost ~1 ms of the scheduler thread)
        self.bitmask = allocate_bitmask(len(reqs), vocab_size, pin=pin, init=False)
        self.filled: set[int] = set()  # rows filled: by the job, or early (``fill``)
        self._job: cf.Future | None = None
        self._facts: cf.Future | None = None
        self._fill_job: cf.Future | None = None

    def covers(self, req: Any) -> bool:
        return id(req) in self.rows

    def start(self, reqs: Sequence[Any], jump: bool = False) -> None:
        """Hand ``reqs`` over: accept each one's newest output token, report ``RowFacts``
        (``jump``: with the jump-forward text), then fill the rows of those whose token fit
        and that do not jump."""
        grammars = [r.grammar for r in reqs]
        tokens = [r.output_ids[-1] for r in reqs]
        rows = [self.rows[id(r)] for r in reqs]
        facts: cf.Future = cf.Future()

        def job() -> set[int]:
            try:
                accepted = accept_token_grouped(grammars, tokens)
                found = [_facts(g, ok, jump) for g, ok in zip(grammars, accepted)]
            except BaseException as e:
                facts.set_exception(e)
                raise
            facts.set_result(found)
            # NOTE: a complete value is filled even with a jump text: whether only a stop
            # token may follow is read from its row (the scheduler thread waits for it)
            keep = [i for i, f in enumerate(found) if f.ok and not f.terminated
                    and (f.completed or not f.jump)]
            fill_bitmask_grouped([grammars[i] for i in keep], self.bitmask,
                                 [rows[i] for i in keep])
            return {rows[i] for i in keep}

        self._facts = facts
        self._job = _executor().submit(job)

    def start_fill(self, reqs: Sequence[Any]) -> None:
        """Fill the rows of ``reqs`` (matchers already advanced, untouched by the read: the
        jump-forward rows this step fed) on the helper thread now, before any handed job."""
        reqs = [r for r in reqs if self.covers(r) and r.grammar is not None
                and r.grammar.thread_safe_batch and not r.finished]
        if not reqs:
            return
        grammars, rows = [r.grammar for r in reqs], [self.rows[id(r)] for r in reqs]

        def job() -> set[int]:
            fill_bitmask_grouped(grammars, self.bitmask, rows)
            return set(rows)

        self._fill_job = _executor().submit(job)

    def result(self) -> list[RowFacts]:
        """Wait for the accepts; each handed-over row's ``RowFacts`` (``start``'s order). The
        matchers of rows that jump, or whose token was rejected, are the scheduler thread's
        again now; the others' after ``wait_filled``."""
        return self._facts.result()

    def wait_filled(self) -> None:
        """Wait for the job's fill: every handed matcher is the scheduler thread's again."""
        if self._job is not None:
            self.filled |= self._job.result()
            self._job = None

    def fill(self, reqs: Sequence[Any]) -> None:
        """Fill the rows of ``reqs`` (not handed over; done with their matchers this step) on
        the calling thread now, while the job may still run: their fill overlaps the job's
        instead of waiting for it (each thread fills through its own batch filler)."""
        reqs = [r for r in reqs if self.covers(r)]
        if reqs:
            rows = [self.rows[id(r)] for r in reqs]
            fill_bitmask_grouped([r.grammar for r in reqs], self.bitmask, rows)
            self.filled.update(rows)

    def row(self, req: Any) -> torch.Tensor:
        return self.bitmask[self.rows[id(req)]]

    def settle(self, rows: Sequence[int]) -> list[int]:
        """The step's constrained ``rows`` are final: rows filled here whose request left are
        no longer filled, every row not filled here is opened (its contents were undefined);
        returns the rows of ``rows`` still to fill."""
        if self._fill_job is not None:
            self.filled |= self._fill_job.result()
            self._fill_job = None
        self.wait_filled()
        self.filled.intersection_update(rows)
        open_rows(self.bitmask, [i for i in range(self.bitmask.shape[0]) if i not in self.filled])
        return [i for i in rows if i not in self.filled]

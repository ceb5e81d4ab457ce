"""The per-step half of GrammarManager: ``prefetch`` (rows accepted and filled on a helper
thread while the step runs, prefetch.py), ``fill_bitmask`` before sampling (one packed bitmask
for the batch) and ``after_sample`` once tokens are appended (one batch accept call; matchers
advanced, finished requests ended, jump-forward and forced completions decided and applied
through ``forcing/appends.py``).

A mixin: it uses the manager's ``vocab_size``, ``completion``, ``deferred``, ``jump_forward``,
``jump_max_batch``, ``pin_memory``, ``eos`` and ``stats`` (manager.py sets them).
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from .base import accept_token_grouped, allocate_bitmask, fill_bitmask_grouped
from .forcing.appends import Forcing
from .forcing.jump_forward import only_stop_allowed, stop_only_row
from .prefetch import MaskPrefetch


class GrammarSteps(Forcing):
    """Mixin of GrammarManager: what the scheduler calls each decode step."""

    def prefetch(self, reqs: Sequence[Any]) -> MaskPrefetch | None:
        """A prefetch for the decode step of ``reqs`` whose tokens are read next (prefetch.py),
        or None when no row's grammar can be handed to a helper thread."""
        if not any(r.grammar is not None and r.grammar.thread_safe_batch for r in reqs):
            return None
        return MaskPrefetch(reqs, self.vocab_size, pin=self.pin_memory)

    def fill_bitmask(self, reqs: Sequence[Any], skip: Sequence[bool] | None = None,
                     prefetch: MaskPrefetch | None = None) -> torch.Tensor | None:
        """The batch bitmask (rows aligned with ``reqs``; unconstrained rows allow every
        token), or None when no row is constrained. ``skip[i]``: row i's result will be
        dropped (its request finished or left since the step launched), leave it open.
        ``prefetch``: the step's prefetch, whose filled rows are kept.

        Rows are filled per grammar class in one native batch call (xgrammar: its own thread
        pool); the caller overlaps this with the forward already queued on the device."""
        rows = [i for i, req in enumerate(reqs) if req.grammar is not None and not req.finished
                and not (skip is not None and skip[i])]
        todo = rows if prefetch is None else prefetch.settle(rows)
        if not rows:
            return None
        t0 = time.perf_counter()
        bitmask = (allocate_bitmask(len(reqs), self.vocab_size, pin=self.pin_memory)
                   if prefetch is None else prefetch.bitmask)
        fill_bitmask_grouped([reqs[i].grammar for i in todo], bitmask, todo)
        self.stats.mask_fill_s.append((time.perf_counter() - t0) / len(rows))
        del self.stats.mask_fill_s[:-1024]  # a window, not a leak
        return bitmask

    def after_sample(self, reqs: Sequence[Any], checker: Any, batch_size: int = 1,
                     prefetch: MaskPrefetch | None = None) -> list[Any]:
        """Advance matchers by each request's newest token (one batch call per grammar class);
        returns the requests that took forced tokens (jump-forward, a forced completion) and
        are still running: their tokens have no KV yet. ``batch_size``: requests decoding now (jump-forward only up to
        ``jump_max_batch``). ``prefetch``: the next step's (see ``prefetch``); rows with
        nothing else to do this step are accepted and filled there, on a helper thread, and
        the others' rows are filled here as soon as they are advanced, while that job runs;
        the handed rows' completion measurements are left for ``plan_deferred``, which the
        caller runs once the step's sampling is launched."""
        jump = self.jump_forward and (
            self.jump_max_batch is None or batch_size <= self.jump_max_batch)
        live = [r for r in reqs if r.grammar is not None and not (
            r.finished and r.finish_reason.get("type") == "abort")]
        handed = [] if prefetch is None else [r for r in live if self._can_hand(r, prefetch)]
        if handed:
            prefetch.start(handed, jump)
            ids = {id(r) for r in handed}
            kept = [r for r in live if id(r) not in ids]
        else:
            kept = live
        self.stats.sampled_tokens += len(live)
        # (request, its jump-forward text or None: not asked yet), jumped at the end
        jumpers: list[tuple[Any, str | None]] | None = [] if jump else None
        requeue = self._advance(kept, checker, jumpers)
        if handed:
            back = {id(r) for r in requeue}
            prefetch.fill([r for r in kept if not r.finished and id(r) not in back])
            requeue += self._advance_handed(handed, prefetch, checker, jumpers)
        elif jumpers:
            requeue += self._jump_batch(jumpers, checker)
        return requeue

    def _can_hand(self, req: Any, prefetch: MaskPrefetch) -> bool:
        """Whether ``req``'s matcher has nothing to do before the sampling launch but accept
        and fill (a completion measurement due is made after it: ``plan_deferred``)."""
        return (req.grammar.thread_safe_batch and not req.finished and prefetch.covers(req)
                and not (req.completion is not None and req.completion.finishing))

    def plan_deferred(self, checker: Any) -> tuple[list[Any], list[Any]]:
        """The completion measurements ``after_sample`` deferred (rows the prefetch accepted
        and filled), made once the step's sampling is launched: (the requests measured, those
        of them forced that must go back to the queue for an extend; the others forced are
        finished). A request forced here leaves the batch like one finished by the read: the
        token sampled for it meanwhile is dropped.

        NOTE: made after the launch rather than before it, this Python work (~1.3 ms at 256
        rows on the H100 host) takes the host's idle time while the device samples, instead
        of delaying the sampling launch; made beside the prefetch job it delayed the job's
        own GIL turns (after_sample 9.1-11.2 ms against 8.9-10.2 after the job)."""
        reqs, self.deferred = self.deferred, []
        requeue = []
        for req in reqs:
            if req.finished or not self.completion.due(req):
                continue
            plan = self.completion.plan(req, req.grammar)
            if plan is not None and self._force(req, req.grammar, plan, checker, final=True):
                requeue.append(req)
        return reqs, requeue

    def _advance_handed(self, handed: list[Any], prefetch: MaskPrefetch, checker: Any,
                        jumpers: list | None) -> list[Any]:
        """``_advance`` for the rows the prefetch accepted, from its ``RowFacts``; then the
        jump-forwards (``jumpers``, with the kept rows') while the job fills the other rows.
        A complete value is decided once its row is filled (only a stop token left?).
        Returns the requests that took forced tokens and are still running."""
        requeue, complete = [], []
        for req, facts in zip(handed, prefetch.result()):
            if not facts.ok:
                req.finish_reason = {"type": "abort",
                                     "message": "the sampled token does not fit the grammar"}
            elif facts.terminated:
                self._finish_with_stop(req, req.grammar)
            elif facts.completed:  # filled even with a jump text: decided once filled
                complete.append((req, facts))
            elif self._decide(req, facts.jump, checker, jumpers):
                requeue.append(req)
        if jumpers:
            requeue += self._jump_batch(jumpers, checker)
        prefetch.wait_filled()
        if not complete:
            return requeue
        late: list | None = None if jumpers is None else []
        for req, facts in complete:
            if not req.return_logprob and stop_only_row(prefetch.row(req), self.vocab_size,
                                                        self.eos):
                self._finish_with_stop(req, req.grammar)
            elif self._decide(req, facts.jump, checker, late):
                requeue.append(req)
        return requeue + (self._jump_batch(late, checker) if late else [])

    def _decide(self, req: Any, text: str, checker: Any, jumpers: list | None) -> bool:
        """A handed row still running: it jumps forward where its grammar forces ``text``; a
        completion measurement due waits for the sampling launch (``deferred``) unless the row
        jumps. True if forced tokens were appended to a request still running.

        NOTE: a row that is due and jumps is measured here, before its jump, as on the
        scheduler thread without a prefetch (``_settle``): measured after the jump it was not
        the same decision. The jump's text ends where the grammar stops forcing, often in a
        lone space (``"ok": `` -> ``'":'``, ``' '``), which the completion measured before it
        spells with the value (``' false'``): one token more after the jump, so a budget
        whose slack was 1 before the jump had 0 after it, and the overlapped engine forced
        ``false}`` one step early where the synchronous one let the model sample ``true``
        (the embedded model, benchmarks/RESULTS.md, spec-real row (d)). Such a row's matcher
        is the scheduler thread's already (the prefetch does not fill jumping rows)."""
        if not (self.completion and self.completion.due(req)):
            if jumpers is not None and text:
                jumpers.append((req, text))
            return False
        if jumpers is None or not text:
            self.deferred.append(req)
            return False
        return self._settle(req, req.grammar, checker, jumpers, text)

    def _advance(self, live: list[Any], checker: Any, jumpers: list[Any] | None) -> list[Any]:
        accepted = accept_token_grouped([r.grammar for r in live],
                                        [r.output_ids[-1] for r in live])
        requeue = []
        for req, ok in zip(live, accepted):
            grammar = req.grammar
            if not ok:
                if not req.finished:  # a length-finished last token needs no acceptance
                    req.finish_reason = {"type": "abort", "message":
                                         "the sampled token does not fit the grammar"}
                continue
            if req.completion is not None and req.completion.finishing and (  # complete
                    req.output_ids[-1] not in self.eos):
                self._end_completed(req, grammar)
                continue
            if req.finished:
                continue
            # NOTE: a request returning logprobs samples its stop token (it needs its logprob)
            # rather than having it appended.
            if grammar.is_terminated() or not req.return_logprob and only_stop_allowed(
                    grammar, self.vocab_size, self.eos):
                self._finish_with_stop(req, grammar)
            elif self._settle(req, grammar, checker, jumpers):
                requeue.append(req)
        return requeue

    def _settle(self, req: Any, grammar: Any, checker: Any, jumpers: list | None,
                text: str | None = None) -> bool:
        """A forced completion when one is due (completion.py; True if its tokens were
        appended to a request still running), else the request joins ``jumpers`` (None:
        jump-forward off; ``text``: its jump-forward text if known), whose jump-forwards are
        made in one batch (``_jump_batch``)."""
        if self.completion and self.completion.due(req) and (
                plan := self.completion.plan(req, grammar)) is not None:
            return self._force(req, grammar, plan, checker, final=True)
        if jumpers is not None:
            jumpers.append((req, text))
        return False

"""Forced completion: a constrained generation ends with a complete value whenever its budget
allows one.

Per constrained request the tracker keeps ``need``, the tokens the shortest completion found
from the request's state takes (``shortest.py``), plus the stop token. When the remaining budget
(``max_new_tokens`` minus the output so far) comes within ``slack_tokens`` of ``need``, the
completion is appended as forced tokens (retokenized at the boundary, as jump-forward does) and
the request finishes with its stop token; the manager applies it (``GrammarManager._complete``).

Cheap per step: ``due`` is one comparison. A measurement runs at the first sampled token and
then at geometrically shrinking intervals (a third of the slack left), so a request measures
about ``log(max_new_tokens)`` times before it nears its budget and every step only in the last
``slack_tokens + need`` tokens; a plan still ahead of the output (the model sampled its next
token) is reused without searching. An estimate far from the end that the answer cache
lacks is searched in a worker process and taken a fixed number of steps later
(``estimate.py``); the measurement that forces is made here, from the request's own state.

One sampled token can raise ``need`` by far more than the slack: a ``,`` opening another array
item whose required keys and date-time take 40 tokens, a level of recursive nesting (jump-
forward adds its keys at once) 20 more each step. So the reserve kept beside ``need`` is the
largest ``need`` the request has shown (at least ``slack_tokens``, at most a quarter of
``max_new_tokens``): a value it needed once can be opened again (the next array item, another
level of the same recursion; continuation.py measures the jumps a "," after the plan's closers
would bring), and the value is completed while the budget still holds it. When
the bounded search finds nothing, ``search_deep`` tries again (scaled by the output's length,
capped in time); repeated failures back off, except in the last quarter of the budget, where
searches keep coming and a few deep ones more are allowed.

The repetition guard ends runaway output early (``runaway.py``): when the last
``repetition_window`` tokens repeat one pattern of at most 4 tokens, or a longer one (up to half
the window) inside one string or number or nesting deeper each time, the value is completed
right away. It is checked every ``repetition_window // 2`` tokens, not per token.

The knobs and the per-request state are in ``budget.py``; the plan's text against the output
sampled since (its rest, string state, token counts) in ``plan_ahead.py``.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..base import Grammar, GrammarKey
from .budget import Budget, CompletionConfig
from .continuation import Continuations
from .estimate import COLLECT_AFTER, EstimateJobs
from .jump_forward import JumpForward, force_text
from .plan_ahead import PlanAhead
from .runaway import is_runaway
from .search_walk import completes
from .shortest import CompletionSearch
from ..vocab import fast_decoder, fast_encoder

# An estimate goes to the worker only this many tokens or more before the one in hand
# would force (more than estimate.COLLECT_AFTER: the answer comes that many steps late).
_ASYNC_MARGIN = 8
# Deep searches a request may still make in the last quarter of its budget after repeated
# failures (each capped by CompletionSearch.deep_seconds, on the scheduler thread).
_LAST_RESORTS = 3
# Finish reason of a request that ends at a complete value without sampling its stop token
# (one returning logprobs: a stop token it did not sample would have none).
COMPLETED = {"type": "stop", "matched": None}


class CompletionTracker(PlanAhead):
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int],
                 config: CompletionConfig = CompletionConfig(), backend: Any = None,
                 disk: Any = None) -> None:
        """``backend``: the ``GrammarBackend`` whose grammars are tracked; with a ``spec``
        (it can be rebuilt in another process) estimates go to a worker (estimate.py), which
        reads its grammars from the on-disk cache ``disk`` where they are."""
        self.tokenizer = tokenizer
        self._decode, self._encode = fast_decoder(tokenizer), fast_encoder(tokenizer)
        self.config = config
        self.search = CompletionSearch(tokenizer, vocab_size, stop_ids,
                                       max_expansions=config.max_expansions)
        self._counts: dict[str, int] = {}  # text -> token count (see _count)
        # peak rises a new item or key after the plan's closers would bring (continuation.py)
        self.continuations = Continuations(tokenizer, self.search, self._count)
        # estimates far from the budget's end, searched in a worker process (estimate.py)
        self.jobs = (EstimateJobs(self.search, backend, disk) if config.async_estimates
                     and getattr(backend, "spec", None) is not None else None)
        self.forced = 0  # requests completed by force
        self.repetitions = 0  # of those, ended by the repetition guard

    def may_estimate(self, req: Any) -> bool:
        """Whether ``req`` can ever send an estimate to the worker (its budget leaves room for
        one ``_ASYNC_MARGIN`` ahead); if not, the worker need not compile its grammar."""
        return self.jobs is not None and req.sampling_params.max_new_tokens > _ASYNC_MARGIN + 1

    @staticmethod
    def due(req: Any) -> bool:
        budget = req.completion
        return budget is None or len(req.output_ids) >= budget.check_at

    def plan(self, req: Any, grammar: Grammar) -> JumpForward | None:
        """Measure ``req``; if it must finish now, apply the completion to ``grammar`` and
        return it (tokens to append, stop token not included), else None."""
        budget = req.completion = req.completion or Budget()
        n = len(req.output_ids)
        repeating = self._repeating(req.output_ids)
        if budget.job is not None and n >= budget.job.at + COLLECT_AFTER:
            self._collect(req, budget)
        if repeating or n >= budget.search_at and budget.job is None and not self._submit(
                req, grammar, budget, n):
            self._measure(req, grammar, budget, check=False)  # an estimate
        plan = self._decide(req, grammar, budget, n, repeating)
        if budget.job is not None:  # its answer is taken then
            budget.check_at = min(budget.check_at, budget.job.at + COLLECT_AFTER)
        return plan

    def _submit(self, req: Any, grammar: Grammar, budget: Budget, n: int) -> bool:
        """Measure an estimate without searching on this thread, where it may come a few
        steps late: not the first measurement and not near the end of the budget. The
        previous plan or the answer cache may answer at once; else the search goes to the
        worker (estimate.py). False: measure here."""
        remaining = req.sampling_params.max_new_tokens - n
        if (self.jobs is None or not budget.peak
                or remaining - budget.need - self._reserve(req, budget) < _ASYNC_MARGIN
                or self._plan_ahead(req, budget, estimate=True) is not None):
            return False
        hit, keys = self.search.cached(grammar, check=False)
        if hit is not None:
            budget.checked = False
            self._record(req, budget, hit.text, n, lambda: self.continuations.most(grammar, hit.text))
            return True
        budget.job = self.jobs.submit(grammar, req.output_ids, keys, budget.failures < 4,
                                      GrammarKey.from_constraint(*req.sampling_params.constraint))
        return budget.job is not None

    def _collect(self, req: Any, budget: Budget) -> None:
        """Take the answer of ``req``'s estimate (``COLLECT_AFTER`` steps after it was asked,
        always, so that when a request is forced never depends on the worker)."""
        pending, budget.job = budget.job, None
        found = self.jobs.answer(pending)
        if pending.shared != "full":
            if pending.shared == "local" and (found is None or not completes(
                    pending.grammar, found.token_ids)):  # another state's: not this one's
                found = self.search.search(pending.grammar, check=False)
            else:
                self.search.store(pending.grammar, pending.keys, found)
                self.jobs.taken(pending)
        if pending.at < budget.plan_at:  # a measurement from a later state is in
            return
        text = None if found is None else found.text
        budget.checked = False
        self._record(req, budget, text, pending.at,
                     lambda: self.continuations.most(pending.grammar, text))

    def _decide(self, req: Any, grammar: Grammar, budget: Budget, n: int,
                repeating: bool) -> JumpForward | None:
        slack = req.sampling_params.max_new_tokens - n - budget.need - self._reserve(req, budget)
        if budget.plan is not None and (slack <= 0 or repeating) and (
                budget.plan_at != n or not budget.checked):
            self._measure(req, grammar, budget)  # about to force: from the current state
        if budget.plan is None:
            budget.check_at = min(budget.search_at, self._next_repetition_check(n))
            return None
        if slack > 0 and not repeating:
            budget.search_at = min(budget.search_at, n + max(1, slack // 3))
            budget.check_at = min(budget.search_at, self._next_repetition_check(n))
            return None
        remaining = req.sampling_params.max_new_tokens - n
        plan = self._apply(req, grammar, budget.plan, remaining)
        if plan is None:  # does not fit (any more): measure again when it might
            # NOTE: an output token shortens the need by a few tokens at most; measuring each
            # step while a deep nesting needs 500 tokens more than are left was 2-4 ms a step
            budget.search_at = budget.check_at = n + max(1, (budget.need - remaining) // 4)
            return None
        self.forced += 1
        self.repetitions += int(repeating)
        budget.finishing = True
        return plan

    def _reserve(self, req: Any, budget: Budget) -> int:
        """Tokens kept beside ``need``: room for the next rise of it (see the module doc)."""
        cap = req.sampling_params.max_new_tokens // 4
        return max(self.config.slack_tokens, min(budget.peak, cap))

    @staticmethod
    def _end_zone(req: Any) -> bool:
        """In the last quarter of the budget."""
        return 4 * len(req.output_ids) >= 3 * req.sampling_params.max_new_tokens

    def _last_resort(self, req: Any, budget: Budget) -> bool:
        """A deep search after repeated failures: allowed in the end zone, up to
        ``_LAST_RESORTS`` times per request. NOTE: without it a request whose searches all
        failed earlier (from inside a long string of an array item, outlines) ran to its
        budget with nothing to force (JsonSchemaStore__bootstraprc in the schema suite)."""
        if budget.last_resorts >= _LAST_RESORTS or not self._end_zone(req):
            return False
        budget.last_resorts += 1
        return True

    def _measure(self, req: Any, grammar: Grammar, budget: Budget, check: bool = True) -> None:
        n = len(req.output_ids)
        ahead = self._plan_ahead(req, budget)
        if ahead is not None:  # the output followed the plan: checked if the plan was
            budget.checked = check or budget.checked
        else:  # NOTE: a plan followed in structure only is an estimate, never "checked"
            ahead = None if check else self._plan_ahead(req, budget, estimate=True)
            budget.checked = check
        if ahead is None:
            found = self.search.search(grammar, check=check)
            if found is None and (budget.failures < 4 or self._last_resort(req, budget)):
                found = self.search.search_deep(grammar, n)  # the rare path: search harder
                budget.checked = True  # searched from this very state
            ahead = None if found is None else found.text
        self._record(req, budget, ahead, n, lambda: self.continuations.most(grammar, ahead))

    def _record(self, req: Any, budget: Budget, plan: str | None, at: int,
                continued: Callable[[], int]) -> None:
        """Keep a measurement: ``plan`` found from the state after ``at`` output tokens
        (None: nothing found); ``continued``: see ``Continuations.most`` (called only if needed)."""
        n = len(req.output_ids)
        budget.plan, budget.plan_at = plan, at
        self._lex(req, budget, at)
        if plan is None:  # nothing found: try again later, less often each time in a row
            budget.failures += 1
            wait = 8 << min(budget.failures - 1, 3)
            if self._end_zone(req):  # but never past the end: a later state may be easier
                wait = min(wait, max(1, (req.sampling_params.max_new_tokens - n) // 4))
            budget.need, budget.search_at = 0, n + wait
            return
        budget.need, budget.failures = self._count(plan) + 1, 0
        if budget.peak < req.sampling_params.max_new_tokens // 4:  # else the cap holds it
            budget.peak = max(budget.peak, budget.need, continued())
        budget.search_at = 1 << 62  # plan() sets the next search from the slack

    def _apply(self, req: Any, grammar: Grammar, text: str, remaining: int) -> JumpForward | None:
        """Force ``text`` (leaving one token for the stop); None if it does not fit or does not
        complete the value (grammar untouched then)."""
        if not text:
            return JumpForward(0, (), "") if grammar.is_completed() else None
        # NOTE: a request that finishes now keeps its last token (no merge at the boundary):
        # with overlap scheduling that token's KV may be computed already, and a finished
        # request's KV goes to the radix cache under its ids.
        history = req.output_ids if req.return_logprob else ()
        plan = force_text(grammar, self.tokenizer, history, text, remaining - 1)
        if plan is None:
            return None
        if grammar.is_completed() and len(plan.token_ids) - plan.rollback < remaining:
            return plan
        grammar.rollback(len(plan.token_ids))
        if plan.rollback:
            grammar.accept_token(req.output_ids[-1])
        return None

    def _repeating(self, output_ids: list[int]) -> bool:
        window = self.config.repetition_window
        return bool(window) and is_runaway(self.tokenizer, output_ids, window)

    def _next_repetition_check(self, n: int) -> int:
        window = self.config.repetition_window
        return n + max(1, window // 2) if window else 1 << 30

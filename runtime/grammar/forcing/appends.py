"""Forcing: the half of GrammarManager that appends text the grammar forces instead of
sampling it - jump-forward (forced runs of text), forced completions (a complete value when
the budget runs out, grammar/forcing/completion.py) and the lone stop token - and undoes or ends
those appends where logprobs or the budget require.

A mixin: it uses the manager's ``tokenizer``, ``eos`` and ``stats``.
"""
from __future__ import annotations

from typing import Any

from .completion import COMPLETED
from .jump_forward import jump_forward_batch


class Forcing:
    """Mixin of GrammarManager."""

    def _finish_with_stop(self, req: Any, grammar: Any) -> None:
        """The grammar admits nothing but a stop token: append it instead of a decode step."""
        if not grammar.is_terminated():
            req.output_ids.append(self.eos[0])
            req.forced_positions.append(len(req.output_ids) - 1)
            grammar.accept_token(self.eos[0])
        req.finish_reason = {"type": "stop", "matched": req.output_ids[-1]}

    def _jump_batch(self, jumpers: list[tuple[Any, str | None]], checker: Any) -> list[Any]:
        """Jump-forward for each (request, its forced text or None: ask its grammar) where
        the grammar forces text (accepted in batch calls); returns the requests that took
        forced tokens and are still running."""
        reqs = [r for r, _ in jumpers]
        plans = jump_forward_batch(
            [r.grammar for r in reqs], self.tokenizer, [r.output_ids for r in reqs],
            [r.sampling_params.max_new_tokens - len(r.output_ids) for r in reqs],
            [text for _, text in jumpers])
        return [r for r, plan in zip(reqs, plans)
                if plan is not None and self._force(r, r.grammar, plan, checker)]

    def _force(self, req: Any, grammar: Any, plan: Any, checker: Any, final: bool = False) -> bool:
        """Append a plan already applied to ``grammar``; True if the request must go back to
        the queue for an extend. ``final`` (a forced completion): the value is complete, so a
        request without logprobs finishes with its stop token right away (its forced tokens
        need no KV); one with logprobs gets them scored by that extend, then samples its stop."""
        last = req.output_ids[-1] if req.output_ids else None
        if plan.rollback:
            del req.output_ids[-plan.rollback:]
        start = len(req.output_ids)
        req.output_ids.extend(plan.token_ids)
        # NOTE: the first ``rollback`` tokens of a plan respell the sampled token(s) they
        # replace (retokenized with the forced text): they count as sampled.
        req.forced_positions = [p for p in req.forced_positions if p < start]
        req.forced_positions.extend(range(start + plan.rollback, len(req.output_ids)))
        # NOTE: with overlap scheduling the replaced token's KV may already be computed (in
        # flight); the release that follows (requeue or finish) drops it (memory.py).
        req.jump_kv_valid = req.seq_len - len(plan.token_ids) if plan.rollback else 0
        req.finish_reason = checker.check(req)
        if final and not req.finished and not req.return_logprob:
            self._finish_with_stop(req, grammar)
        elif final and not req.finished and not plan.token_ids:  # complete as it stands
            req.finish_reason = dict(COMPLETED)
        if req.return_logprob and plan.token_ids:
            if req.finished:  # no extend would follow to score the forced tokens: sample them
                self._undo_jump(req, grammar, plan, last)
                return False
            # NOTE: the replaced token's logprob entry was recorded this step; the forced
            # tokens' entries (it included) come from the rows of the next extend.
            del req.output_token_logprobs[len(req.output_token_logprobs) - plan.rollback:]
            del req.output_top_logprobs[len(req.output_top_logprobs) - plan.rollback:]
            req.forced_logprobs_owed = len(plan.token_ids)
        self.stats.jump_forward_tokens += len(plan.token_ids) - plan.rollback
        return not req.finished and bool(plan.token_ids)

    @staticmethod
    def _end_completed(req: Any, grammar: Any) -> None:
        """A logprob request whose forced completion was scored by an extend sampled one more
        token: the value was already complete, so that token is dropped (no KV yet) and the
        request finishes as complete."""
        grammar.rollback(1)
        req.output_ids.pop()
        del req.output_token_logprobs[len(req.output_ids):]
        del req.output_top_logprobs[len(req.output_ids):]
        req.finish_reason = dict(COMPLETED)

    @staticmethod
    def _undo_jump(req: Any, grammar: Any, plan: Any, last: int | None) -> None:
        req.jump_kv_valid = 0
        grammar.rollback(len(plan.token_ids))
        del req.output_ids[len(req.output_ids) - len(plan.token_ids):]
        req.forced_positions = [p for p in req.forced_positions if p < len(req.output_ids)]
        if plan.rollback:
            req.output_ids.append(last)
            grammar.accept_token(last)
        req.finish_reason = None

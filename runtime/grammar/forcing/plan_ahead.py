"""Where the previous completion plan stands against the output sampled since it was found:
the plan's rest when the new tokens spell its beginning (or, for an estimate, follow its
structure: ``plan_follow.rest_after``), whether the output ends inside a JSON string, and the
token counts of plan texts (kept, since requests sharing an answer count the same texts).

A mixin of ``CompletionTracker`` (completion.py): it uses the tracker's ``_decode``,
``_encode`` and ``_counts``.
"""
from __future__ import annotations

from typing import Any

from .budget import Budget
from .plan_follow import rest_after

_COUNT_CACHE = 4096


class PlanAhead:
    """Mixin of CompletionTracker: the plan's text against the output."""

    def _count(self, text: str) -> int:
        """Tokens ``text`` encodes to. NOTE: requests sharing a search answer (or the rest of
        one) count the same texts; encoding is ~50 us, so counts are kept (bounded, oldest
        dropped first)."""
        n = self._counts.get(text)
        if n is None:
            n = self._counts[text] = len(self._encode(text))
            if len(self._counts) > _COUNT_CACHE:
                del self._counts[next(iter(self._counts))]
        return n

    def _plan_ahead(self, req: Any, budget: Budget, estimate: bool = False) -> str | None:
        """The rest of the previous plan if the tokens sampled since spell its beginning.
        ``estimate``: also where they wrote other values in the plan's structure
        (``plan_follow.rest_after``; an estimate: the plan's values were the shortest)."""
        if budget.plan is None or not budget.plan_at:
            return None
        # NOTE: one measurement asks up to three times (submit, exact, estimate): the answers
        # are kept for this output length and plan (at 256 rows, ~26 measured per step, the
        # repeated decoding and structure walks were half the tracker's host time)
        key = (len(req.output_ids), budget.plan_at, budget.plan)
        if budget.ahead_key != key:
            new = self._decode(req.output_ids[budget.plan_at:])
            budget.ahead_key = key
            budget.ahead = {"new": None if not new or "\ufffd" in new else new}
        memo = budget.ahead
        if estimate not in memo:
            memo[estimate] = self._rest(budget, memo["new"], estimate)
        return memo[estimate]

    @staticmethod
    def _rest(budget: Budget, new: str | None, estimate: bool) -> str | None:
        if new is None:
            return None
        if budget.plan.startswith(new):
            rest = budget.plan[len(new):]
        elif estimate:
            rest = rest_after(budget.plan, new, in_string=budget.lex[1])
        else:
            rest = None
        return rest or None

    def _lex(self, req: Any, budget: Budget, at: int) -> bool:
        """Whether the first ``at`` output tokens end inside a JSON string, scanning only
        the tokens since the last call (quotes and backslashes are ASCII: a slice that
        splits a multi-byte character does not change the answer)."""
        done, string, escape = budget.lex
        if at < done:  # an older state's measurement: scan from the start
            done, string, escape = 0, False, False
        key = budget.ahead_key  # _plan_ahead may have decoded exactly these tokens
        text = budget.ahead.get("new") if key and key[:2] == (at, done) else None
        for ch in text if text is not None else self._decode(req.output_ids[done:at]):
            if escape:
                escape = False
            elif string and ch == "\\":
                escape = True
            elif ch == '"':
                string = not string
        budget.lex = (at, string, escape)
        return string

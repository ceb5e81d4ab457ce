"""Appending a verify step's emitted tokens to a request, as decode steps would one by one.

Each token goes through the finish checks (EOS, stop ids/strings/regex, max_new_tokens: the
output ends at the first that fires). A constrained request's matcher takes every appended token
but the last (the last goes through the grammar's own step, ``GrammarManager.after_sample``:
jump-forward, termination, forced completion). The draft was cut before any token after which the
grammar would step in (grammar_drafts.py), except for forced-completion measurements: for a
request they can finish without further ado (no logprobs, no penalties: ``measures_inline``) a
measurement due after a token is made right there, from the matcher in the state after it, as
the decode step of that token would make it; when it forces, the completion is appended, the
request finishes and the rest of the emitted tokens are dropped (with the KV columns that no
longer hold its tokens). So a due measurement never stops a draft.
"""
from __future__ import annotations

from typing import Any

_MISFIT = {"type": "abort", "message": "a verified draft token does not fit the grammar"}


def append_emitted(sched: Any, req: Any, emitted: list[int]) -> tuple[int, bool]:
    """Append ``emitted`` up to the first finish; returns (tokens of ``emitted`` appended,
    whether a forced completion was applied on the way: the grammar's step is taken then)."""
    grammar = req.grammar
    manager = sched.grammar
    inline = grammar is not None and measures_inline(req, manager)
    n = 0
    for j, token in enumerate(emitted):
        req.output_ids.append(token)
        n += 1
        req.finish_reason = sched.checker.check(req)
        if req.finish_reason is not None:
            break
        if inline and j < len(emitted) - 1:
            if not grammar.accept_token(token):
                req.finish_reason = dict(_MISFIT)
                break
            if _forced(sched, req):
                return n, True
    if grammar is not None and not inline and n > 1 and not grammar.accept_tokens(
            emitted[:n - 1]):
        req.finish_reason = dict(_MISFIT)
    return n, False


def measures_inline(req: Any, manager: Any) -> bool:
    """Whether ``req``'s forced-completion measurements are made between its accepted draft
    tokens (a forced completion simply finishes it) rather than cutting its draft before the
    next one (``grammar_drafts.draft_limit``): no logprobs owed, no penalties (such requests go
    back to the queue for an extend after forced tokens)."""
    return manager.completion is not None and not req.return_logprob \
        and not req.sampling_params.has_penalties


def _forced(sched: Any, req: Any) -> bool:
    """The measurement due after the newest token, as ``GrammarSteps._settle`` makes it;
    True if it forced (the request is finished then)."""
    manager = sched.grammar
    completion = manager.completion
    if not completion.due(req):
        return False
    plan = completion.plan(req, req.grammar)
    if plan is None:
        return False
    manager._force(req, req.grammar, plan, sched.checker, final=True)
    return True


def truncate_to_ids(memory: Any, req: Any, root_col: int, kv_tokens: list[int]) -> None:
    """After a forced completion replaced tokens: keep the KV columns from ``root_col + 1`` on
    only while they hold the request's tokens (``kv_tokens``: what they were written with)."""
    ids = req.all_ids
    keep = 0
    while keep < len(kv_tokens) and root_col + 1 + keep < len(ids) \
            and ids[root_col + 1 + keep] == kv_tokens[keep]:
        keep += 1
    memory.truncate(req, root_col + 1 + keep)

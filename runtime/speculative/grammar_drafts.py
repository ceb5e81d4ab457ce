"""Grammar + speculation: a constrained request's draft is checked against its matcher before
verify, and the verify rows get the masks of the matcher advanced along the draft.

The matcher accepts the draft token by token (each checked against the mask of the state it
is in), filling the mask row of every state on the way, then rolls back: the verify step's
sampling then applies row ``j`` to the logits that choose the token after ``j`` draft tokens,
exactly the mask the non-speculative step would use there. The draft is cut before the first
token the grammar rejects, and after any token after which the non-speculative path would not
sample the next token itself (the grammar is terminated or allows only a stop token, or a
jump-forward would append forced text): that token ends the draft, and when it is accepted the
verify's sample after it is dropped (``ends_in_step``), so it is the last token emitted and the
grammar's own step (``GrammarManager.after_sample``: the jump, the stop) follows it exactly as
in a normal decode step. For requests with logprobs or penalties the draft is also cut where a
forced completion is due; other requests' completion measurements are made between the
accepted tokens (append.py), so they never cut a draft. Grammar drafts are chains (the first
branch of a tree).
"""
from __future__ import annotations

from typing import Any

import torch

from ..grammar.base import allocate_bitmask
from ..grammar.forcing.jump_forward import stop_only_row
from .append import measures_inline
from .base import DraftTree, EMPTY_TREE


def draft_limit(req: Any, manager: Any, max_tokens: int) -> int:
    """Draft tokens the request may take before its forced completion needs a measurement:
    every emitted token but the last must land before ``check_at`` (none before the first
    measurement). Requests measured between their draft tokens (append.py) are not cut."""
    if manager.completion is None or measures_inline(req, manager):
        return max_tokens
    budget = req.completion
    if budget is None:
        return 0
    return max(min(max_tokens, budget.check_at - len(req.output_ids) - 1), 0)


def draft_limit_after(req: Any, manager: Any, max_tokens: int, ahead: int) -> int:
    """``draft_limit`` once ``ahead`` more tokens (in flight) are appended. A measurement due
    by then is made when they are read, and where it sets the next one is not known yet."""
    budget = req.completion
    if manager.completion is None or not ahead or measures_inline(req, manager):
        return draft_limit(req, manager, max_tokens)
    n = len(req.output_ids) + ahead
    if budget is None or budget.check_at <= n:
        return max_tokens
    return max(min(max_tokens, budget.check_at - n - 1), 0)


def first_chain(tree: DraftTree) -> DraftTree:
    """The tree's first branch from the root, as a chain."""
    n = 0
    while n < len(tree) and tree.parents[n] == n - 1:
        n += 1
    return tree.prefix(n)


def check_draft(req: Any, tree: DraftTree, manager: Any, jump: bool,
                limit: int) -> tuple[DraftTree, torch.Tensor, bool]:
    """The accepted prefix of the draft (a chain), its mask rows ``[len + 1, words]`` and
    whether its last token is one after which the grammar steps in: then the sample after it
    is not the model's to make (the verify drops it, ``ends_in_step``) and its mask row
    allows everything (that sample is never used)."""
    grammar = req.grammar
    chain = first_chain(tree).prefix(limit)
    vocab, eos = manager.vocab_size, manager.eos
    rows = allocate_bitmask(len(chain) + 1, vocab)
    grammar.fill_bitmask(rows, 0)
    n, steps_in = 0, False
    for token in chain.tokens:
        if not _allowed(rows[n], token) or not grammar.accept_token(token):
            break
        n += 1
        if _grammar_steps_in(grammar, jump):
            steps_in = True
            break
        grammar.fill_bitmask(rows, n)
        if not req.return_logprob and grammar.is_completed() and stop_only_row(
                rows[n], vocab, eos):
            rows[n].numpy().fill(-1)
            steps_in = True
            break
    if n:
        grammar.rollback(n)
    return (chain.prefix(n) if n else EMPTY_TREE), rows[:n + 1], steps_in


def _grammar_steps_in(grammar: Any, jump: bool) -> bool:
    """After this token the grammar, not the sampler, decides what comes next."""
    return grammar.is_terminated() or (jump and bool(grammar.jump_forward_string()))


def _allowed(words: torch.Tensor, token: int) -> bool:
    if token < 0 or (token >> 5) >= words.shape[0]:
        return False
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)

"""Whether a speculative step would draft, judged before the step in flight is read.

With overlap scheduling a plain decode step is in flight when the next step is decided. A
speculative step must read it first (its draft starts after that step's token), and the read is
then synchronous: the host's bookkeeping no longer hides behind the device's next forward. When
the proposal then comes back empty (nothing matched, the grammar cut the draft, a forced-
completion measurement due), that step was a plain step that lost its overlap: a speculative
engine slower than a plain one exactly where it cannot speculate.

So the decision is made from the state known now: each request's ids without the token in
flight. The drafter predicts (``Drafter.predict``, NGRAM: its lookup on the known ids, the
continuation's first token standing for the token in flight), a constrained request's
prediction is walked through its grammar from the matcher's current state (the token in flight
included), and the draft limits are those after the token in flight. Only when some request
would draft is the step in flight read and the real proposal made; otherwise the scheduler runs
its plain overlapped step. A wrong guess either way costs time, never tokens: a missed draft is
proposed one step later (the known state then includes the token), a wrong hit is one plain step
read synchronously (``spec_empty_proposals``).

Drafters that cannot predict cheaply (a draft model: its forward is the proposal) return None:
their requests are taken to draft whenever their limits allow.
"""
from __future__ import annotations

from typing import Any

from .grammar_drafts import check_draft, draft_limit_after, first_chain


def expect_drafts(decoder: Any, sched: Any, reqs: list[Any], inflight: Any) -> bool:
    """Whether any of ``reqs`` would draft once ``inflight`` (the step launched, not read)
    is read."""
    # NOTE: a prefill in flight samples only requests that join the batch at its read
    live = {id(r) for r in inflight.live()} if inflight.sampled else set()
    ahead = [int(id(r) in live) for r in reqs]
    limits = [_limit(decoder, sched, r, a) for r, a in zip(reqs, ahead)]
    asked = [i for i, n in enumerate(limits) if n > 0]
    if not asked:
        return False
    guesses = decoder.drafter.predict([reqs[i] for i in asked], max(limits) + 1)
    if guesses is None:  # a drafter that always drafts
        return True
    manager = sched.grammar
    jump = manager is not None and manager.jump_forward and (
        manager.jump_max_batch is None or len(reqs) <= manager.jump_max_batch)
    for i, guess in zip(asked, guesses):
        req, skip = reqs[i], ahead[i]
        chain = first_chain(guess).prefix(limits[i] + skip)
        if req.grammar is not None and len(chain) > skip:
            chain, _, _ = check_draft(req, chain, manager, jump, len(chain))
        if len(chain) > skip:
            return True
    return False


def _limit(decoder: Any, sched: Any, req: Any, ahead: int) -> int:
    """Draft tokens ``req`` may take after ``ahead`` tokens in flight are appended (as
    ``SpecDecoder._limit`` and ``draft_limit`` will say then), without counting a backoff."""
    backoff = req.spec_backoff
    if backoff is not None and backoff.wait > 0:
        return 0
    room = min(req.remaining_tokens - ahead - 1, decoder.context_len - req.seq_len - ahead - 1)
    limit = max(min(decoder.k, room), 0)
    if req.grammar is not None and sched.grammar is not None:
        limit = draft_limit_after(req, sched.grammar, limit, ahead)
    return limit

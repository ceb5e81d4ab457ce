"""AheadBatch: the next verify batch, built while the device runs this one, for a guess of
what this step accepts (a copy's usual step: each request accepts its whole first branch and
the bonus token is the one its text goes on with; the drafter's prefetched lookup,
``Drafter.guess_next``, is the draft there).

The next step takes it only when every request's state and draft turn out to be the guessed
ones (same requests in the same order; each one's ``req_to_token`` row, KV length, fed tokens
and draft tree): ``build_verify_at`` is a function of those alone, so the batch is the one
the step would have built, but for which free KV slots it holds. Otherwise its slots are
freed; the ``req_to_token`` columns it wrote lie past every request's KV (a request's columns
are written again before they are read). A request leaving (finish, abort, retraction) frees
it at once (``SpecDecoder.release``), so nothing is held when the engine is idle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..model.forward_batch import ForwardBatch
from .base import DraftTree
from .verify_batch import VerifyLayout, build_verify_at, feed_of

# KV slots left free after a batch is built ahead (it never makes a decode step retract)
_SPARE = 64


@dataclass
class AheadBatch:
    reqs: list[Any]
    feeds: list[tuple[int, int, tuple[int, ...]]]
    trees: list[DraftTree]
    batch: ForwardBatch
    layout: VerifyLayout
    memory: Any
    taken: bool = False  # by its step (or freed)
    # launched already (pipeline.py): its logits and the read of its samples
    logits: Any = None
    read: Any = None

    def matches(self, reqs: Sequence[Any], trees: Sequence[DraftTree]) -> bool:
        """Whether this is the batch ``build_verify(reqs, trees)`` would build now."""
        return (len(reqs) == len(self.reqs) and all(a is b for a, b in zip(reqs, self.reqs))
                and list(trees) == self.trees and [feed_of(r) for r in reqs] == self.feeds)

    def holds(self, req: Any) -> bool:
        return any(r is req for r in self.reqs)

    def free(self) -> None:
        self.memory.kv_pool.free(self.layout.slots)


def build_ahead(decoder: Any, sched: Any, reqs: Sequence[Any], trees: Sequence[DraftTree],
                layout: VerifyLayout) -> AheadBatch | None:
    """During the verify of ``trees`` (laid out as ``layout``): the next step's batch if each
    request accepts its first branch whole with the drafter's guessed bonus token; None when
    some request has no guess (or a grammar, or may stop drafting) or KV is not plentiful."""
    feeds, guesses = [], []
    for i, req in enumerate(reqs):
        guess = decoder.drafter.guess_next(req.rid)
        backoff = req.spec_backoff
        if guess is None or req.grammar is not None or req.pending_forced or (
                backoff is not None and backoff.wait > 0):
            return None
        emitted, draft = guess  # the accepted branch and the bonus token; the draft after
        limit = _limit_after(decoder, req, len(emitted))
        draft = draft.prefix(min(len(draft), limit))
        if not draft:
            return None
        kv_len = layout.kv_lens[i] + len(emitted)  # the root and the accepted nodes
        feeds.append((req.req_pool_idx, kv_len, (emitted[-1],)))
        guesses.append(draft)
    need = sum(1 + len(t) for t in guesses)
    memory = sched.memory
    if memory.kv_pool.available() < need + _SPARE:
        return None
    built = build_verify_at(feeds, guesses, memory, sched.device)
    if built is None:
        return None
    return AheadBatch(list(reqs), feeds, guesses, built[0], built[1], memory)


def _limit_after(decoder: Any, req: Any, emitted: int) -> int:
    """``SpecDecoder._limit`` once ``emitted`` more tokens are appended."""
    remaining = req.max_new_tokens - len(req.output_ids) - emitted
    room = min(remaining - 1, decoder.context_len - req.seq_len - emitted - 1)
    return max(min(decoder.k, room), 0)

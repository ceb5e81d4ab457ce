"""NGRAM drafter: draft tokens copied from the request's own prompt and output.

The last ``n`` tokens of a request (``n`` from the max match window down to the min) are looked
up among the earlier positions of the same request; the tokens that followed the most recent
earlier occurrence of the longest matching suffix are the draft. Copy-heavy work (code edits,
quoting, extraction, JSON that repeats its input's keys) drafts many accepted tokens; free text
drafts little, and the scheduler's per-request backoff then stops asking.

Per request the ids are kept in a numpy buffer, extended incrementally from ``req.all_ids`` and
rebuilt when its tail changed (a jump-forward respelled the last tokens). A lookup is vectorized
over the sequence: the positions holding the last token, then, for at most ``max`` offsets, which
of them still match further back (O(n) compares per step, no per-n-gram index to build: a 4k-token
prompt costs no stall at its first step). With ``speculative_ngram_max_bfs_breadth`` > 1, further
occurrences whose continuations start with other tokens become sibling branches at the first
draft position (a tree). Works on any device: no model, no kernels.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .base import Drafter, DraftTree, EMPTY_TREE, ROOT

# Tokens compared to decide that the ids held still prefix the request's ids.
_TAIL_CHECK = 32


class _Index:
    """One request's ids and its suffix lookups."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.buf = np.empty(256, dtype=np.int64)
        self.n = 0

    def sync(self, all_ids: Sequence[int]) -> None:
        """Follow ``all_ids``: extend, or start over where it diverged from what we hold."""
        n = self.n
        tail = max(n - _TAIL_CHECK, 0)
        if len(all_ids) < n or list(all_ids[tail:n]) != self.buf[tail:n].tolist():
            n = 0
        new = all_ids[n:]
        if n + len(new) > self.buf.shape[0]:
            grown = np.empty(max(2 * self.buf.shape[0], n + len(new)), dtype=np.int64)
            grown[:n] = self.buf[:n]
            self.buf = grown
        self.buf[n:n + len(new)] = new
        self.n = n + len(new)

    def continuations(self, length: int, breadth: int) -> list[list[int]]:
        """Up to ``breadth`` continuations (distinct first tokens) of the longest suffix (at
        least ``lo`` tokens) that occurred before, the most recent occurrence first, each at
        most ``length`` tokens."""
        ids, n = self.buf, self.n
        if n < 2:
            return []
        cand = np.flatnonzero(ids[:n - 1] == ids[n - 1])  # earlier ends of a 1-token match
        size = np.ones(cand.shape[0], dtype=np.int64)
        alive = cand.copy()
        for d in range(1, min(self.hi, n - 1)):
            ok = (alive >= d) & (ids[np.maximum(alive - d, 0)] == ids[n - 1 - d])
            if not ok.any():
                break
            size[ok & (size == d)] += 1
            alive = np.where(ok, alive, -1 - n)  # dropped: never matches again
        best = int(size.max()) if size.size else 0
        if best < self.lo:
            return []
        ends = cand[size == best][::-1] + 1  # the most recent occurrence first
        out: list[list[int]] = []
        for end in ends.tolist():
            cont = ids[end:min(end + length, n)].tolist()
            # NOTE: an occurrence ending less than ``length`` before the end (a loop of
            # period ``n - end``) continues by copying the copy: its tokens repeat
            cont = [cont[j % len(cont)] for j in range(length)] if cont else cont
            if cont and all(c[0] != cont[0] for c in out):
                out.append(cont)
            if len(out) == breadth:
                break
        return out


class NgramDrafter(Drafter):
    """Drafts from n-gram matches within each request (SGLang's NGRAM, on any device)."""

    def __init__(self, config: Any, runner: Any = None) -> None:
        self.lo = config.speculative_ngram_min_match_window_size
        self.hi = config.speculative_ngram_max_match_window_size
        self.breadth = config.speculative_ngram_max_bfs_breadth
        self.indexes: dict[str, _Index] = {}

    def propose(self, reqs: Sequence[Any], max_tokens: int,
                hidden: Any = None) -> list[DraftTree]:
        return [self._propose_one(req, max_tokens) for req in reqs]

    def _propose_one(self, req: Any, max_tokens: int) -> DraftTree:
        if max_tokens <= 0:
            return EMPTY_TREE
        index = self.indexes.get(req.rid)
        if index is None:
            index = self.indexes[req.rid] = _Index(self.lo, self.hi)
        index.sync(req.all_ids)
        conts = index.continuations(max_tokens, self.breadth)
        return branches_tree(conts, max_tokens)

    def predict(self, reqs: Sequence[Any], max_tokens: int) -> list[DraftTree]:
        """The same lookup on the ids known now (the index keeps them: the next ``propose``
        only extends it)."""
        return self.propose(reqs, max_tokens)

    def proposal_cost(self) -> float:
        """A host lookup, no forward: nothing in target steps."""
        return 0.0

    def release(self, rid: str) -> None:
        self.indexes.pop(rid, None)

    def check_idle(self) -> list[str]:
        return [f"ngram index kept for {len(self.indexes)} finished request(s)"] \
            if self.indexes else []


def branches_tree(conts: list[list[int]], max_tokens: int) -> DraftTree:
    """The first continuation as the main chain; each other one adds a sibling of its first
    token (one node each), within ``max_tokens`` nodes in all."""
    if not conts:
        return EMPTY_TREE
    side = [c[0] for c in conts[1:]][:max(max_tokens - 1, 0)]
    main = conts[0][:max_tokens - len(side)]
    tokens = list(main) + side
    parents = list(range(ROOT, len(main) - 1)) + [ROOT] * len(side)
    return DraftTree(tuple(tokens), tuple(parents))

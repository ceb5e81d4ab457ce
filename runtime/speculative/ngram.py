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

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .base import Drafter, DraftTree, EMPTY_TREE, ROOT

# Tokens compared to decide that the ids held still prefix the request's ids.
_TAIL_CHECK = 32
_OFFSETS = np.arange(256)  # match depths, kept (a longer window makes its own)


class _Index:
    """One request's ids and its suffix lookups."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.buf = np.empty(256, dtype=np.int64)
        self.n = 0
        self.generation = 0  # bumped when the ids are rebuilt (a prefetched lookup is stale)

    def sync(self, all_ids: Sequence[int]) -> None:
        """Follow ``all_ids``: extend, or start over where it diverged from what we hold."""
        n = self.n
        tail = max(n - _TAIL_CHECK, 0)
        if len(all_ids) < n or list(all_ids[tail:n]) != self.buf[tail:n].tolist():
            n = 0
            self.generation += 1
        new = all_ids[n:]
        self._reserve(n, n + len(new))
        self.buf[n:n + len(new)] = new
        self.n = n + len(new)

    def _reserve(self, keep: int, size: int) -> None:
        """Room for ``size`` ids, the first ``keep`` kept."""
        if size > self.buf.shape[0]:
            grown = np.empty(max(2 * self.buf.shape[0], size), dtype=np.int64)
            grown[:keep] = self.buf[:keep]
            self.buf = grown

    def continuations(self, length: int, breadth: int,
                      extra: Sequence[int] = ()) -> list[list[int]]:
        """Up to ``breadth`` continuations (distinct first tokens) of the longest suffix (at
        least ``lo`` tokens) that occurred before, the most recent occurrence first, each at
        most ``length`` tokens. ``extra``: ids assumed to follow the ones held (a guess at the
        next step's; written past ``n`` as scratch, the next ``sync`` overwrites them)."""
        n = self.n
        if extra:
            self._reserve(n, n + len(extra))
            self.buf[n:n + len(extra)] = extra
            n += len(extra)
        return _lookup(self.buf, n, self.lo, self.hi, length, breadth)


def _lookup(ids: np.ndarray, n: int, lo: int, hi: int, length: int,
            breadth: int) -> list[list[int]]:
    """``_Index.continuations`` over ``ids[:n]``. Vectorized over the candidates and the
    match depths at once: the earlier positions holding the last token, then a [candidates x
    depth] compare of the tokens before each with the suffix; a candidate's match length is
    its run of equal tokens (a few numpy calls per lookup, whatever the window)."""
    if n < 2:
        return []
    cand = np.flatnonzero(ids[:n - 1] == ids[n - 1])  # earlier ends of a 1-token match
    if cand.size == 0:
        return []
    depth = min(hi, n - 1)
    # the suffix backwards, then a sentinel no id equals: each candidate's match length is
    # the column of its first mismatch (depth 0 always matches)
    want = np.empty(depth + 1, dtype=np.int64)
    want[:depth] = ids[n - depth:n][::-1]
    want[depth] = -1
    offsets = _OFFSETS[:depth + 1] if depth < _OFFSETS.shape[0] else np.arange(depth + 1)
    at = cand[:, None] - offsets  # the tokens compared, back from each candidate
    eq = ids.take(at, mode="clip") == want
    if cand[0] < depth:  # (ascending) only the first candidates reach before the start
        eq &= at >= 0
    size = eq.argmin(axis=1)
    best = int(size.max())
    if best < lo:
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


@dataclass(frozen=True)
class _Prefetched:
    """A lookup made ahead (``NgramDrafter.prefetch``) on the ids held at ``start`` followed
    by ``extra``, for proposals of ``length`` tokens."""

    generation: int
    start: int
    extra: tuple[int, ...]
    length: int
    conts: list[list[int]]


class NgramDrafter(Drafter):
    """Drafts from n-gram matches within each request (SGLang's NGRAM, on any device).

    A lookup is a pure function of the request's ids, so the next step's can be made while the
    device verifies this one (``prefetch``) on the ids the request will hold if its whole draft
    is accepted and the bonus token is the one the copied text goes on with (a copy's usual
    step); ``propose`` takes it when the ids turn out to be those, and looks up afresh
    otherwise. Either way it returns the same tree."""

    def __init__(self, config: Any, runner: Any = None) -> None:
        self.lo = config.speculative_ngram_min_match_window_size
        self.hi = config.speculative_ngram_max_match_window_size
        self.breadth = config.speculative_ngram_max_bfs_breadth
        self.indexes: dict[str, _Index] = {}
        # per request: its last proposal's main continuation, one token longer than asked
        # (that token: the guess at the bonus token) and the length asked
        self.last: dict[str, tuple[list[int], int]] = {}
        self.prefetched: dict[str, _Prefetched] = {}
        self.prefetch_hits = 0  # proposals answered by a prefetched lookup

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
        conts = self._prefetched(req.rid, index, max_tokens)
        if conts is None:
            conts = index.continuations(max_tokens + 1, self.breadth)
        else:
            self.prefetch_hits += 1
        self.last[req.rid] = (conts[0] if conts else [], max_tokens)
        return branches_tree([c[:max_tokens] for c in conts], max_tokens)

    def _prefetched(self, rid: str, index: _Index, length: int) -> list[list[int]] | None:
        """The prefetched lookup, if it was made on exactly the ids held now."""
        got = self.prefetched.get(rid)
        if got is None or got.generation != index.generation or got.length != length:
            return None
        end = got.start + len(got.extra)
        if index.n != end or tuple(index.buf[got.start:end].tolist()) != got.extra:
            return None
        return got.conts

    def prefetch(self, reqs: Sequence[Any], trees: Sequence[DraftTree]) -> None:
        """While the device verifies ``trees``: each request's next lookup on its ids as they
        will be if its first branch is accepted whole and the bonus token is the next token
        of the continuation it was drafted from."""
        for req, tree in zip(reqs, trees):
            self.prefetched.pop(req.rid, None)  # only this step's guess stands
            index, last = self.indexes.get(req.rid), self.last.get(req.rid)
            if index is None or last is None or not tree:
                continue
            cont, length = last
            m = 0  # the first branch: nodes 0..m-1 (a chain)
            while m < len(tree) and tree.parents[m] == m - 1:
                m += 1
            if len(cont) <= m or tuple(cont[:m]) != tree.tokens[:m]:
                continue  # not the lookup's (a grammar cut or respelled it)
            extra = (*tree.tokens[:m], cont[m])
            conts = index.continuations(length + 1, self.breadth, extra)
            self.prefetched[req.rid] = _Prefetched(index.generation, index.n, extra, length,
                                                   conts)

    def guess_next(self, rid: str) -> tuple[tuple[int, ...], DraftTree] | None:
        """This step's guess (``prefetch``): the tokens it appends, and the next draft."""
        got = self.prefetched.get(rid)
        if got is None:
            return None
        return got.extra, branches_tree([c[:got.length] for c in got.conts], got.length)

    def predict(self, reqs: Sequence[Any], max_tokens: int) -> list[DraftTree]:
        """The same lookup on the ids known now (the index keeps them: the next ``propose``
        only extends it)."""
        return self.propose(reqs, max_tokens)

    def proposal_cost(self) -> float:
        """A host lookup, no forward: nothing in target steps."""
        return 0.0

    def release(self, rid: str) -> None:
        self.indexes.pop(rid, None)
        self.last.pop(rid, None)
        self.prefetched.pop(rid, None)

    def check_idle(self) -> list[str]:
        kept = len(set(self.indexes) | set(self.last) | set(self.prefetched))
        return [f"ngram index kept for {kept} finished request(s)"] if kept else []


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

"""NGRAM drafter: draft tokens copied from the request's own prompt and output.

The last ``n`` tokens of a request (``n`` from the max match window down to the min) are looked
up among the earlier n-grams of the same request; the tokens that followed the most recent
earlier occurrence are the draft. Copy-heavy work (code edits, quoting, extraction, JSON that
repeats its input's keys) drafts many accepted tokens; free text drafts little, and the
scheduler's per-request backoff then stops asking.

Per request an index maps each n-gram to the end positions of its latest occurrences; it is
updated incrementally from ``req.all_ids`` (only the tokens appended since the last call), and
rebuilt when the ids changed under it (a jump-forward respelled the last token). With
``speculative_ngram_max_bfs_breadth`` > 1, further occurrences whose continuations start with
other tokens become sibling branches at the first draft position (a tree).
Works on any device: no model, no kernels.
"""
from __future__ import annotations

from typing import Any, Sequence

from .base import Drafter, DraftTree, EMPTY_TREE, ROOT

# Latest occurrences kept per n-gram (branches come from distinct continuations among them).
_ENDS_KEPT = 4


class _Index:
    """The n-gram index of one request's ids."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self.ids: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}
        self.indexed = 0  # n-grams ending before this position are in ``ends``

    def sync(self, all_ids: Sequence[int]) -> None:
        """Follow ``all_ids``: extend, or start over where it diverged from what we hold."""
        n = len(self.ids)
        if len(all_ids) < n or list(all_ids[:n]) != self.ids:
            self.ids, self.ends, self.indexed = [], {}, 0
        self.ids.extend(all_ids[len(self.ids):])
        # NOTE: the n-grams ending at the last token are left out, so a lookup of the suffix
        # finds only earlier occurrences (whose continuation is known).
        for end in range(self.indexed + 1, len(self.ids)):
            for size in range(self.lo, min(self.hi, end) + 1):
                ends = self.ends.setdefault(tuple(self.ids[end - size:end]), [])
                ends.append(end)
                if len(ends) > _ENDS_KEPT:
                    del ends[0]
        self.indexed = max(self.indexed, len(self.ids) - 1)

    def continuations(self, length: int, breadth: int) -> list[list[int]]:
        """Up to ``breadth`` continuations (distinct first tokens) of the longest matching
        suffix, the most recent occurrence first, each at most ``length`` tokens."""
        ids = self.ids
        for size in range(min(self.hi, len(ids)), self.lo - 1, -1):
            ends = self.ends.get(tuple(ids[len(ids) - size:]))
            if not ends:
                continue
            out: list[list[int]] = []
            for end in reversed(ends):
                cont = ids[end:end + length]
                if cont and all(c[0] != cont[0] for c in out):
                    out.append(cont)
                if len(out) == breadth:
                    break
            return out
        return []


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

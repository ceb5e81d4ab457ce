"""``cache_aware``: route to the worker whose approximate prefix tree matches the prompt best.

As in SGLang's Model Gateway: while the load is balanced, the worker with the longest match
wins if the match covers more than ``cache_threshold`` of the prompt; otherwise the least-loaded
worker (the smallest tree among equals, i.e. the one with the most cache room) gets it. When
the load is imbalanced (max - min > ``balance_abs_threshold`` and max > ``balance_rel_threshold``
x min), the least-loaded worker wins regardless of the cache. The prompt is then added to the
chosen worker's tree.
"""
from __future__ import annotations

from typing import Sequence

from ..worker import Worker
from .base import Choice
from .tree_policy import TreePolicy


class CacheAwarePolicy(TreePolicy):
    name = "cache_aware"

    def imbalanced(self, workers: Sequence[Worker]) -> bool:
        loads = [w.load for w in workers]
        high, low = max(loads), min(loads)
        c = self.config
        return high - low > c.balance_abs_threshold and high > c.balance_rel_threshold * low

    def select(self, workers: Sequence[Worker], text: str, output_tokens: int = 0) -> Choice:
        choice = self._choose(workers, text)
        self.tree(choice.worker.url).insert(text)
        return choice

    def _choose(self, workers: Sequence[Worker], text: str) -> Choice:
        if len(workers) > 1 and self.imbalanced(workers):
            return Choice(min(workers, key=lambda w: w.load), "imbalanced")
        if text:
            matches = [(self.tree(w.url).match(text), -w.load, w) for w in workers]
            best, _, worker = max(matches, key=lambda m: m[:2])
            if best / len(text) > self.config.cache_threshold:
                return Choice(worker, "cache_hit")
        return Choice(min(workers, key=lambda w: (w.load, self.tree(w.url).size)), "cache_miss")

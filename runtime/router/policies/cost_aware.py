"""``cost_aware`` (the default): the worker that will have the least work once it has this request.

For each available worker ``w``::

    cost(w) = miss(w) + work(w)
    miss(w) = uncached(w) x (1 + evict_weight x kv_pressure(w))
    work(w) = prefill tokens + decode_token_weight x decode tokens the worker still has

``uncached(w)`` is the prompt's tokens not in ``w``'s prefix cache, predicted by the same
approximate text tree as ``cache_aware`` (characters / characters per token, learned from the
prompt token counts in the workers' answers, ``--chars-per-token`` at first); ``work(w)`` comes
from the worker's ledger (its last ``GET /load`` + what was routed to it since, see ledger.py).
A miss on a worker whose KV is full also evicts cached prefixes that later requests then
recompute, hence the pressure term (``kv_pressure`` = 1 - free / total KV from ``/load``).

So cache affinity wins exactly when the work it saves exceeds the extra work already queued on
the cached worker: with no shared prefixes this is least-work balancing (never the ``64
requests apart`` drift of ``cache_aware``), with shared prefixes and a balanced load every
group stays where its prefix is cached. Ties (all idle): the smaller tree (more cache room),
then the first. Each worker's tree is bounded by what its KV can hold once ``/load`` told it.
"""
from __future__ import annotations

from typing import Sequence

from ..worker import Worker
from .base import Choice
from .text_tree import TextTree
from .tree_policy import TreePolicy


_PRIOR_TOKENS = 2000.0  # weight of --chars-per-token against the measured ratio
_DECAY = 0.999  # per answer: the ratio follows the last few thousand answers


class CostAwarePolicy(TreePolicy):
    name = "cost_aware"
    needs_load = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Characters per token of the routed text, learned from the workers' answers
        # (``observe``), starting from the configured guess.
        self._chars = self.config.chars_per_token * _PRIOR_TOKENS
        self._tokens = _PRIOR_TOKENS

    @property
    def chars_per_token(self) -> float:
        return self._chars / self._tokens

    def observe(self, chars: int, tokens: int) -> None:
        if tokens > 0 and chars > 0:
            self._chars = _DECAY * self._chars + chars
            self._tokens = _DECAY * self._tokens + tokens

    def select(self, workers: Sequence[Worker], text: str, output_tokens: int = 0) -> Choice:
        c = self.config
        weight, per_token = c.decode_token_weight, self.chars_per_token
        rows = []
        for i, w in enumerate(workers):
            tree = self._bounded_tree(w)
            uncached = (len(text) - (tree.match(text) if text else 0)) / per_token
            work = w.ledger.work(weight)
            rows.append((uncached * self._miss_factor(w) + work, tree.size, i, uncached, work))
        cost, _, i, uncached, work = min(rows)
        worker = workers[i]
        self.tree(worker.url).insert(text)
        # "affinity": a worker with less work was passed over for the cache.
        reason = "affinity" if work > min(r[4] for r in rows) else "least_work"
        return Choice(worker, reason, prefill=uncached,
                      decode=output_tokens or c.default_output_tokens)

    def _miss_factor(self, worker: Worker) -> float:
        report = worker.ledger.report
        return 1.0 + self.config.evict_weight * (report.kv_pressure if report else 0.0)

    def _bounded_tree(self, worker: Worker) -> TextTree:
        """The worker's tree, bounded by its KV (a prefix the KV cannot hold is not cached)."""
        tree = self.tree(worker.url)
        report = worker.ledger.report
        if report is not None and report.kv_total:
            tree.max_chars = max(1, min(self.config.max_tree_chars,
                                        int(report.kv_total * self.chars_per_token)))
        return tree

    def describe(self) -> dict:
        return {**super().describe(), "chars_per_token": round(self.chars_per_token, 3)}

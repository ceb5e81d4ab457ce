"""``cost_aware`` (the default): cache affinity, unless the imbalance it leaves would idle a worker.

For each available worker ``w``::

    cost(w) = miss(w) + excess(w)
    miss(w) = uncached(w) x (1 + evict_weight x kv_pressure(w))
    excess(w) = room(lightest) x max(0, work(w) - work(lightest) - band)
    band = work_slack x mean work x (1 + evict_weight x kv_pressure(lightest)),
           at most 2 x work(lightest) while the lightest is running dry

``uncached(w)`` is the prompt's tokens not in ``w``'s prefix cache, predicted by the same
approximate text tree as ``cache_aware`` (characters / characters per token, learned from the
prompt token counts in the workers' answers, ``--chars-per-token`` at first); ``work(w)`` is
prefill tokens + ``decode_token_weight`` x decode tokens the worker still has, from its ledger
(its last ``GET /load`` + what was routed to it since, see ledger.py). A miss on a worker whose
KV is full also evicts cached prefixes that later requests then recompute, hence the pressure
term (``kv_pressure`` = 1 - free / total KV from ``/load``).

Why a band: a miss is work done (a full prefill, and on a full KV someone else's prefix lost),
while an imbalance of queued work costs throughput only once the lighter worker runs dry. So
queued work within the band (twice the mean by default) is not counted: a group's requests stay
on the worker that holds its prefix, and balance comes from where new prefixes go (costs within
``_TIE_TOKENS``: the least work). Beyond the band every token of excess counts against what the
cache saves, so a hot worker still overflows, and a worker running dry takes requests whatever
the cache (its band is at most twice its own work). Running dry is judged by requests in
flight (at most ``dry_fraction`` x the mean), not by tokens: decode is batched, so a worker
whose full batch is near its end shows little work in its ledger yet is busy, and the client
refills it at once. (Token work alone, with half the mean as band, overflowed from such batches: groups
copied, hit rate lost on fits and dp=4 in benchmarks/router_sim.py.) When the lightest worker's
KV is full too, sending it work evicts there as well and its batch cannot grow: the band widens
with its pressure. And the excess is worth only what the lightest worker can start at once: ``room`` =
1 - ``kv_usage`` (the fraction of its KV its requests do not hold); a worker whose running
requests fill its KV would queue the work as the busier one does. (The previous rule, ``miss +
work``, gave up the cache for any imbalance worth one prefill and lost 11 points of hit rate on
a KV-limited H200 pair: benchmarks/RESULTS.md.)

Each worker's tree is bounded to ``_TREE_KV`` x what its KV can hold once ``/load`` told it:
a group whose prefix the worker has since evicted still finds its way back there (a miss
anywhere, but going back keeps each group on one worker instead of a second copy elsewhere).
"""
from __future__ import annotations

from typing import Sequence

from ..worker import Worker
from .base import Choice
from .text_tree import TextTree
from .tree_policy import TreePolicy


_PRIOR_TOKENS = 2000.0  # weight of --chars-per-token against the measured ratio
_DECAY = 0.999  # per answer: the ratio follows the last few thousand answers
_TIE_TOKENS = 16.0  # costs this close are equal: a few characters matched by chance decide nothing
_BAND_PER_LOW = 2.0  # the band is at most this x the lightest worker's work: an idle one gets none
_TREE_KV = 2.0  # each worker's tree remembers this many times what its KV holds (stickiness)


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
        per_token = self.chars_per_token
        uncached = [(len(text) - (self._bounded_tree(w).match(text) if text else 0)) / per_token
                    for w in workers]
        works = [w.ledger.work(c.decode_token_weight) for w in workers]
        low = min(works)
        lightest = workers[works.index(low)]
        band = c.work_slack * sum(works) / len(works) * self._miss_factor(lightest)
        if self._running_dry(lightest, workers, c.dry_fraction):
            band = min(band, _BAND_PER_LOW * low)
        room = self._room(lightest)
        costs = [u * self._miss_factor(w) + room * max(0.0, work - low - band)
                 for u, w, work in zip(uncached, workers, works)]
        best = min(costs)
        i = min((k for k, cost in enumerate(costs) if cost <= best + _TIE_TOKENS),
                key=lambda k: (works[k], self.tree(workers[k].url).size, k))
        worker = workers[i]
        self.tree(worker.url).insert(text)
        # "affinity": a worker with less work was passed over for the cache; "overflow": a
        # worker with more of the prompt cached was passed over for the balance.
        reason = ("overflow" if uncached[i] > min(uncached) + _TIE_TOKENS
                  else "affinity" if works[i] > low else "least_work")
        return Choice(worker, reason, prefill=uncached[i],
                      decode=output_tokens or c.default_output_tokens)

    @staticmethod
    def _running_dry(worker: Worker, workers: Sequence[Worker], fraction: float) -> bool:
        """Few requests in flight on ``worker`` (at most ``fraction`` x the mean): its batch
        may run out before its queued tokens say. A worker with a full batch is busy however
        little work its ledger shows (its requests near their end are refilled at once)."""
        return worker.load <= fraction * sum(w.load for w in workers) / len(workers)

    @staticmethod
    def _room(worker: Worker) -> float:
        """The fraction of the worker's KV its requests do not hold: what work sent to it can
        use at once (the rest would wait in its queue as it would elsewhere)."""
        report = worker.ledger.report
        if report is None or not report.kv_total:
            return 1.0
        return 1.0 - min(1.0, max(0.0, report.kv_usage))

    def _miss_factor(self, worker: Worker) -> float:
        report = worker.ledger.report
        return 1.0 + self.config.evict_weight * (report.kv_pressure if report else 0.0)

    def _bounded_tree(self, worker: Worker) -> TextTree:
        """The worker's tree, bounded by ``_TREE_KV`` x its KV."""
        tree = self.tree(worker.url)
        report = worker.ledger.report
        if report is not None and report.kv_total:
            tree.max_chars = max(1, min(self.config.max_tree_chars,
                                        int(_TREE_KV * report.kv_total * self.chars_per_token)))
        return tree

    def describe(self) -> dict:
        return {**super().describe(), "chars_per_token": round(self.chars_per_token, 3)}

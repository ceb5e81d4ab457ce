"""``power_of_two``: two distinct random workers, the one with fewer requests in flight wins
(the "power of two choices": nearly the balance of least-loaded at the cost of two looks)."""
from __future__ import annotations

from typing import Sequence

from ..worker import Worker
from .base import Choice, Policy


class PowerOfTwoPolicy(Policy):
    name = "power_of_two"

    def select(self, workers: Sequence[Worker], text: str, output_tokens: int = 0) -> Choice:
        if len(workers) == 1:
            return Choice(workers[0], "only")
        a, b = self.rng.sample(list(workers), 2)
        return Choice(b if b.load < a.load else a, "less_loaded")

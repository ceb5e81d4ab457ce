"""``random``: a uniformly random available worker."""
from __future__ import annotations

from typing import Sequence

from ..worker import Worker
from .base import Choice, Policy


class RandomPolicy(Policy):
    name = "random"

    def select(self, workers: Sequence[Worker], text: str, output_tokens: int = 0) -> Choice:
        return Choice(self.rng.choice(list(workers)), "random")

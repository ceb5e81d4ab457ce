"""``round_robin``: the available workers in turn."""
from __future__ import annotations

from typing import Sequence

from ..worker import Worker
from .base import Choice, Policy


class RoundRobinPolicy(Policy):
    name = "round_robin"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.counter = 0

    def select(self, workers: Sequence[Worker], text: str, output_tokens: int = 0) -> Choice:
        worker = workers[self.counter % len(workers)]
        self.counter += 1
        return Choice(worker, "next")

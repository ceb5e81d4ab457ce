"""The policy interface: choose one worker among the available ones for a request's text.

``select`` returns a ``Choice`` (the worker and why it won: the reason is exported per policy
in ``/metrics``). Policies that keep per-worker state (trees, a hash ring) update it in
``on_add``/``on_remove``; the registry calls them when workers come and go.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Sequence

from ..config import RouterConfig
from ..worker import Worker


@dataclass(frozen=True)
class Choice:
    worker: Worker
    reason: str  # e.g. "cache_hit", "cache_miss", "imbalanced", "hash", "next", "random"
    # The work the request is expected to add to the worker (cost_aware; booked in its ledger
    # until the answer ends): uncached prompt tokens and output tokens.
    prefill: float = 0.0
    decode: float = 0.0


class Policy(ABC):
    name: ClassVar[str]

    def __init__(self, config: RouterConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng or random.Random()

    @abstractmethod
    def select(self, workers: Sequence[Worker], text: str, output_tokens: int = 0) -> Choice:
        """Pick one of ``workers`` (non-empty, all available) for a request with ``text`` that
        may generate up to ``output_tokens`` tokens."""

    def on_add(self, url: str) -> None:
        """A worker joined the registry."""

    def on_remove(self, url: str) -> None:
        """A worker left the registry: forget what was kept about it."""

    def on_change(self, event: str, url: str) -> None:
        (self.on_add if event == "add" else self.on_remove)(url)

    def observe(self, chars: int, tokens: int) -> None:
        """A worker answered a prompt of ``chars`` routing-text characters: ``tokens`` tokens."""

    def describe(self) -> dict:
        """Policy state for ``/list_workers`` (e.g. tree sizes)."""
        return {"policy": self.name}

    needs_load: ClassVar[bool] = False  # True: the router polls the workers' GET /load


def least_loaded(workers: Sequence[Worker]) -> Worker:
    """The worker with the fewest requests in flight (the first of equals)."""
    return min(workers, key=lambda w: w.load)

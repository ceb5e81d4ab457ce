"""Liveness of a node's tensor-parallel ranks: each rank counts its scheduler loop iterations
in shared memory; the engine's main process watches the counters (``TokenizerManager``).

Healthy ranks iterate at least every ~0.5 s even when idle (rank 0 wakes from its idle wait and
broadcasts, the others return from that broadcast). A rank whose counter has not moved for
``rank_hang_timeout_s`` is hung; since a hung rank stalls its peers' collectives too, the rank
named is the one furthest behind (the others wait for it); ranks tied there are all named (a
rank stuck inside a collective ties with the peers waiting in it).
"""
from __future__ import annotations

import time
from typing import Any


class Heartbeats:
    """One shared counter per local rank (``multiprocessing`` shared memory)."""

    def __init__(self, ctx: Any, ranks: int) -> None:
        self.counts = ctx.Array("q", ranks, lock=False)

    @staticmethod
    def beat(counts: Any, index: int) -> None:
        counts[index] += 1  # the owning rank is the only writer


class HangMonitor:
    """The main process's view: which ranks stopped moving, and for how long."""

    def __init__(self, counts: Any, timeout_s: float) -> None:
        self.counts, self.timeout_s = counts, timeout_s
        now = time.monotonic()
        self.last = list(counts)
        self.moved = [now] * len(self.last)

    def hung(self) -> list[int] | None:
        """None while every rank moves; once one has been still for the timeout, the ranks
        to blame (the furthest behind: the others wait for them in a collective)."""
        now = time.monotonic()
        current = list(self.counts)
        for i, c in enumerate(current):
            if c != self.last[i]:
                self.last[i], self.moved[i] = c, now
        if not any(now - t >= self.timeout_s for t in self.moved):
            return None
        behind = min(current)
        return [i for i, c in enumerate(current) if c == behind]

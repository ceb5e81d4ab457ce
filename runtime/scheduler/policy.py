"""Waiting-queue ordering. LPM (longest cached prefix first) raises cache hits by running
requests that share a cached prefix together before the prefix is evicted; FCFS is arrival order.
"""
from __future__ import annotations

from typing import Literal

from .memory import KVMemory
from .req import Req

# NOTE: LPM matches every waiting request against the tree on each scheduling pass; past this
# queue length that costs more than it saves, so we fall back to FCFS (as SGLang does).
LPM_MAX_QUEUE = 128


class SchedulePolicy:
    def __init__(self, policy: Literal["lpm", "fcfs"], memory: KVMemory) -> None:
        if policy not in ("lpm", "fcfs"):
            raise ValueError(f"unknown schedule policy {policy!r}")
        self.policy = policy
        self.memory = memory

    def order(self, waiting: list[Req]) -> list[Req]:
        """The queue in the order the prefill adder should try it. Retracted requests (they
        already hold output) go first under either policy so they finish soon."""
        use_lpm = (self.policy == "lpm" and not self.memory.tree.disable
                   and len(waiting) <= LPM_MAX_QUEUE)
        if use_lpm:
            for req in waiting:
                # hicache: host-resident tokens count too (loaded, not prefilled)
                req.match_len = self.memory.match_len(req) + req.host_hit_len
            key = lambda r: (r.num_retractions == 0, -r.match_len, r.arrival)  # noqa: E731
        else:
            key = lambda r: (r.num_retractions == 0, r.arrival)  # noqa: E731
        return sorted(waiting, key=key)

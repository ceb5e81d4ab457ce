"""``PoolLimits``: how much compiling the worker pool (``worker_pool.py``) may do, and the
number of compile workers a machine gets by default.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ...errors import InvalidRequestError

WALL_BACKSTOP = 10  # x timeout_s: the wall-time bound of a compile (its CPU time is timeout_s)

@dataclass(frozen=True)
class PoolLimits:
    """How much compiling the pool may do (``EngineConfig.grammar_compile_*``). ``workers``
    None: from the machine's cores (``default_workers``)."""

    workers: int | None = None
    max_queued: int = 512
    memory_bytes: int = 2 << 30  # per compile, on top of the worker's own footprint
    timeout_s: float = 10.0  # a compile's deadline, from when its worker starts it
    max_result_bytes: int = 256 << 20  # what a worker ships back to the parent
    max_wait_s: float = 60.0  # expected queue wait beyond which a new compile is refused

    def __post_init__(self) -> None:
        if self.workers is None:
            object.__setattr__(self, "workers", default_workers())
        if not isinstance(self.max_wait_s, (int, float)) or not self.max_wait_s >= 0:
            raise InvalidRequestError("grammar_compile_max_wait_s must be a number >= 0, not "
                                      f"{self.max_wait_s!r}", field="grammar_compile_max_wait_s")
        for name, value, least in (("grammar_compile_workers", self.workers, 1),
                                   ("grammar_compile_queue", self.max_queued, 1),
                                   ("grammar_compile_memory_bytes", self.memory_bytes, 0)):
            if not isinstance(value, int) or value < least:
                raise InvalidRequestError(f"{name} must be an integer >= {least}, not {value!r}",
                                          field=name)


    def deadline(self, started: float, cpu: float | None) -> tuple[float, float | None]:
        """When a compile that started at ``started`` (monotonic) on a worker that had then
        used ``cpu`` seconds of CPU (None: unknown) is stopped: (monotonic time, the worker's
        CPU time or None). The deadline counts compile work: ``timeout_s`` of the worker's CPU
        time (a loaded machine stretches a compile's wall time, not its work), with
        ``WALL_BACKSTOP`` times that of wall time for a compile that hangs without using CPU;
        where CPU time is unknown, ``timeout_s`` of wall time."""
        if cpu is None:
            return started + self.timeout_s, None
        return started + WALL_BACKSTOP * self.timeout_s, cpu + self.timeout_s


def default_workers() -> int:
    """Compile workers for this machine: one per core but one (the scheduler's), at least 2 (a
    slow compile must not hold up every other), at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 2
    return max(2, min(cores - 1, 8))


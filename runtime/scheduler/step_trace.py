"""StepTrace: ``$SGDSL_STEP_TRACE`` (a folder): one JSON line per scheduler loop iteration in
``steps-rank{N}.jsonl``: when it started (``t``: since the trace began; ``at``: wall clock,
comparable with the main process's stamps), how long it took on the host, and where that time
went (handling messages, the disaggregation poll, admission, launching, reading the previous
step: the last includes waiting for the device). A slow decode iteration is a late token for
every running request, so the tail of this file explains an ITL p99 (``benchmarks/gpu/
bench_pd.py --trace`` summarizes it). Off by default: the hooks are instance attributes set
only when the variable is set, so the normal loop pays nothing.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

# NOTE: parts of an iteration, by the scheduler attribute that does them ("pd.poll": the
# disaggregation side's poll). Each is timed where it is called (nested calls count in both).
PARTS = ("pd.poll", "pd._allocate", "pd._drain_done", "memory.cache_chunk", "sampler.new_info",
         "running.merge", "_finish_and_send", "_schedule_prefill", "_launch_extend",
         "_launch_decode", "_read",
         "memory.load", "memory.release", "memory.issue_backups")  # hicache: tier moves
FLUSH_S = 1.0


class StepTrace:
    def __init__(self, scheduler: Any, path: str) -> None:
        self.sched = scheduler
        self.file = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - closed by close()
        self.parts: dict[str, float] = {}
        self.t0 = time.perf_counter()
        self._begin = self._handled = self._wall = 0.0
        self._msgs = 0
        self._flushed = time.monotonic()
        self._forward0 = self._extend0 = 0
        for name in PARTS:
            owner, attr = _resolve(scheduler, name)
            if owner is not None and hasattr(owner, attr):
                setattr(owner, attr, self._timed(name, getattr(owner, attr)))

    def _timed(self, name: str, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - t
        return timed

    def begin(self) -> None:
        self._begin = time.perf_counter()
        self._wall = time.time()
        self.parts = {}
        self._forward0 = self.sched.counters["forward_steps"]
        self._extend0 = self.sched.counters["extend_steps"]

    def handled(self, n_msgs: int) -> None:
        self._handled = time.perf_counter()
        self._msgs = n_msgs

    def end(self) -> None:
        """After ``step``: one line (iterations that launched nothing are skipped)."""
        s, now = self.sched, time.perf_counter()
        if s.counters["forward_steps"] == self._forward0 and not self._msgs:
            return
        row = {"t": round(self._begin - self.t0, 5), "at": round(self._wall, 6), "ms": round((now - self._begin) * 1e3, 3),
               "handle_ms": round((self._handled - self._begin) * 1e3, 3), "msgs": self._msgs,
               "running": len(s.running), "waiting": len(s.waiting),
               "launched": s.counters["forward_steps"] - self._forward0,
               "extend": s.counters["extend_steps"] - self._extend0,
               **{k: round(v * 1e3, 3) for k, v in self.parts.items()}}
        if s.pd is not None:
            row.update(s.pd.stats())  # pd: counters (the reader takes differences) and queues
        self.file.write(json.dumps(row) + "\n")
        if time.monotonic() - self._flushed > FLUSH_S:
            self._flushed = time.monotonic()
            self.file.flush()

    def close(self) -> None:
        self.file.close()


def _resolve(scheduler: Any, name: str) -> tuple[Any, str]:
    owner = scheduler
    *path, attr = name.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    return owner, attr


def make_trace(scheduler: Any, rank: int) -> StepTrace | None:
    folder = os.environ.get("SGDSL_STEP_TRACE")
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    return StepTrace(scheduler, os.path.join(folder, f"steps-rank{rank}.jsonl"))

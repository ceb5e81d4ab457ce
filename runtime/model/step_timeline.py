"""StepTimeline: where a decode token's device time goes in the running engine, graph or between
graphs (``$SGDSL_STEP_TIMELINE``, a path prefix; off by default).

The step graphs (step_graphs.py) record a CUDA event just before and just after each replay.
After ``skip`` steps (start-up, the first requests' prefill) the next ``count`` are kept; then
one host sync reads them and ``{prefix}-rank{N}.json`` gets the medians of the graph's own time
(start to end), of the period (one start to the next) and of their difference, the time between
two graphs (the step's copy, launch gaps, and whatever else the stream ran there: a prefill, a
sampling of the logits). A benchmark's per-token time minus the period's median is the host's
share (a device that waited for the host shows it as a longer gap).
"""
from __future__ import annotations

import json
import os
import statistics
from typing import Any

import torch

SKIP, COUNT = 20, 200


class StepTimeline:
    def __init__(self, prefix: str, rank: int, skip: int = SKIP, count: int = COUNT) -> None:
        self.path = f"{prefix}-rank{rank}.json"
        self.skip, self.count = skip, count
        self.seen = 0
        self.events: list[tuple[Any, Any, int]] = []

    @classmethod
    def from_env(cls, runner: Any) -> "StepTimeline | None":
        prefix = os.environ.get("SGDSL_STEP_TIMELINE")
        device = getattr(runner, "device", None)
        if not prefix or device is None or torch.device(device).type != "cuda":
            return None
        return cls(prefix, getattr(runner, "tp_rank", 0))

    @property
    def active(self) -> bool:
        return self.skip <= self.seen < self.skip + self.count

    def before(self) -> Any:
        """An event recorded now if this step is kept (None otherwise)."""
        self.seen += 1
        if not self.active:
            return None
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start

    def after(self, start: Any, rows: int) -> None:
        if start is None:
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.events.append((start, end, rows))
        if len(self.events) == self.count:
            self._write()

    def _write(self) -> None:
        self.events[-1][1].synchronize()
        graph = [s.elapsed_time(e) * 1e3 for s, e, _ in self.events]
        period = [a[0].elapsed_time(b[0]) * 1e3 for a, b in zip(self.events, self.events[1:])]
        gaps = [p - g for p, g in zip(period, graph)]
        out = {"steps": len(self.events), "rows": sorted({r for _, _, r in self.events}),
               "graph_us": statistics.median(graph), "period_us": statistics.median(period),
               "between_us": statistics.median(gaps),
               "between_us_p90": sorted(gaps)[int(0.9 * (len(gaps) - 1))]}
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "w") as f:
            json.dump(out, f)
        self.events = []

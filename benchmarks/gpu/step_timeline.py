"""Per-step device and host timeline of a decode run: where a step's milliseconds go and
whether the device waits for the host (structured-decode benchmark, ``--timeline``).

For each forward the scheduler launches, CUDA events are recorded on the stream before the
forward, after it (before sampling) and after the sampling, and host clocks at the same
points. From them, per decode step (averaged over steps of the run):

- ``fwd``: device time of the forward;
- ``fwd->samp end``: from the forward's end to the sampling's end on the device (sampling
  plus any wait for the host to launch it: the mask not ready yet);
- ``idle``: from the sampling's end to the next forward's start (the host had not launched it);
- host ``launch fwd``: host time inside the forward call (graph replay);
- host ``fwd->samp launch``: host time from the forward launched to the sampling launched
  (with overlap: reading the previous step, grammar accept/fill);
- host ``samp->next fwd``: host time from the sampling launched to the next forward launched
  (bookkeeping, scheduling, building the next batch).

If the device is never idle and ``fwd->samp end`` equals the sampling alone, the step is
device-bound; otherwise the host's chain is the step.
"""
from __future__ import annotations

import time

import torch

_MARKS: list[tuple] = []  # (kind, host time, cuda event)
_ON = [False]


def _mark(kind: str) -> None:
    if not _ON[0]:
        return
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    _MARKS.append((kind, time.perf_counter(), ev))


def install() -> None:
    """Wrap ``ModelRunner.forward`` and ``BatchSampler.sample_ids`` with marks."""
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.scheduler.sample_step import BatchSampler

    fwd, samp = ModelRunner.forward, BatchSampler.sample_ids

    def forward(self, batch, __fn=fwd):
        _mark("fwd0" if batch.mode.is_decode else "ext0")
        out = __fn(self, batch)
        _mark("fwd1" if batch.mode.is_decode else "ext1")
        return out

    def sample_ids(self, *a, __fn=samp, **kw):
        out = __fn(self, *a, **kw)
        _mark("samp")
        return out

    ModelRunner.forward, BatchSampler.sample_ids = forward, sample_ids


def start() -> None:
    _MARKS.clear()
    _ON[0] = True


def stop() -> dict[str, float]:
    """Averages in ms over decode steps whose forward, sampling and next forward were marked."""
    _ON[0] = False
    torch.cuda.synchronize()
    m = list(_MARKS)
    _MARKS.clear()
    acc = {k: 0.0 for k in ("fwd", "fwd->samp end", "idle", "launch fwd",
                            "fwd->samp launch", "samp->next fwd")}
    n = 0
    for i in range(len(m) - 3):
        kinds = [x[0] for x in m[i:i + 4]]
        if kinds != ["fwd0", "fwd1", "samp", "fwd0"]:
            continue
        (_, h0, e0), (_, h1, e1), (_, h2, e2), (_, h3, e3) = m[i:i + 4]
        acc["fwd"] += e0.elapsed_time(e1)
        acc["fwd->samp end"] += e1.elapsed_time(e2)
        acc["idle"] += e2.elapsed_time(e3)
        acc["launch fwd"] += 1e3 * (h1 - h0)
        acc["fwd->samp launch"] += 1e3 * (h2 - h1)
        acc["samp->next fwd"] += 1e3 * (h3 - h2)
        n += 1
    return {"steps": n, **{k: v / max(n, 1) for k, v in acc.items()}}

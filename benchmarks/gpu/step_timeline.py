"""Per-step device and host timeline of a decode run: where a step's milliseconds go and
whether the device waits for the host (structured-decode benchmark, ``--timeline``).

For each forward the scheduler launches, CUDA events are recorded on the stream before the
forward, after it (before sampling) and after the sampling, and host clocks at the same
points. From them, per decode step (averaged over steps of the run):

- ``fwd``: device time of the forward;
- ``wait samp``: from the forward's end to the sampling's start on the device (the host had
  not launched it: the mask was not ready);
- ``samp``: device time of the sampling (mask upload and application included);
- ``idle``: from the sampling's end to the next forward's start (the host had not launched it);
- host ``launch fwd``: host time inside the forward call (graph replay);
- host ``fwd->samp launch``: host time from the forward launched to the sampling launched
  (with overlap: reading the previous step, grammar accept/fill), of which ``ids wait`` is
  spent waiting for the previous step's sampled ids;
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
_WAITS: list[float] = []  # host seconds in HostIds.tolist
SEGMENTS: dict[str, float] = {}  # host seconds by part of a decode read (see _segments)


def _mark(kind: str) -> None:
    if not _ON[0]:
        return
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    _MARKS.append((kind, time.perf_counter(), ev))


def install() -> None:
    """Wrap ``ModelRunner.forward`` and ``BatchSampler.sample_ids`` with marks."""
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.scheduler.inflight import HostIds
    from sgdsl.runtime.scheduler.sample_step import BatchSampler
    from sgdsl.runtime.scheduler.stepping import Stepping

    fwd, samp, launch, tolist = (ModelRunner.forward, BatchSampler.sample_ids,
                                 Stepping._sample, HostIds.tolist)

    def forward(self, batch, __fn=fwd):
        _mark("fwd0" if batch.mode.is_decode else "ext0")
        out = __fn(self, batch)
        _mark("fwd1" if batch.mode.is_decode else "ext1")
        return out

    def sample_ids(self, *a, __fn=samp, **kw):
        out = __fn(self, *a, **kw)
        _mark("samp")
        return out

    def _sample(self, *a, __fn=launch, **kw):
        _mark("samp0")
        return __fn(self, *a, **kw)

    def host_tolist(self, __fn=tolist):
        t0 = time.perf_counter()
        try:
            return __fn(self)
        finally:
            if _ON[0]:
                _WAITS.append(time.perf_counter() - t0)

    ModelRunner.forward, BatchSampler.sample_ids = forward, sample_ids
    Stepping._sample, HostIds.tolist = _sample, host_tolist
    _segments()


_IN_READ = [False]  # a decode step's read is running (segments below count only then)


def _timed(owner, attr: str, key: str, only_in_read: bool = True) -> None:
    """Wrap ``owner.attr`` to add its wall time to ``SEGMENTS[key]``."""
    fn = getattr(owner, attr)

    def wrapped(*a, __fn=fn, **kw):
        if not _ON[0] or (only_in_read and not _IN_READ[0]):
            return __fn(*a, **kw)
        t0 = time.perf_counter()
        try:
            return __fn(*a, **kw)
        finally:
            SEGMENTS[key] = SEGMENTS.get(key, 0.0) + time.perf_counter() - t0
    setattr(owner, attr, wrapped)


def _segments() -> None:
    """Host time inside a decode step's read, by part (``SEGMENTS``, ms per decode read)."""
    from sgdsl.runtime.grammar.forcing.completion import CompletionTracker
    from sgdsl.runtime.grammar.manager import GrammarManager
    from sgdsl.runtime.grammar.prefetch import MaskPrefetch
    from sgdsl.runtime.grammar.forcing.shortest import CompletionSearch
    from sgdsl.runtime.scheduler.inflight import HostIds
    from sgdsl.runtime.scheduler.scheduler import Scheduler
    from sgdsl.runtime.scheduler.stepping import Stepping

    read = Stepping._read

    def _read(self, step, __fn=read):
        _IN_READ[0] = _ON[0] and step.mode.is_decode
        t0 = time.perf_counter()
        try:
            return __fn(self, step)
        finally:
            if _IN_READ[0]:
                SEGMENTS["read"] = SEGMENTS.get("read", 0.0) + time.perf_counter() - t0
                SEGMENTS["reads"] = SEGMENTS.get("reads", 0.0) + 1e-3
            _IN_READ[0] = False
    Stepping._read = _read
    _timed(HostIds, "tolist", "read: ids wait")
    _timed(GrammarManager, "after_sample", "read: after_sample")
    _timed(GrammarManager, "_advance", "read: advance kept rows")
    _timed(CompletionTracker, "plan", "read: plan")
    # NOTE: any thread's searches while a read runs (the estimate thread's included)
    _timed(CompletionSearch, "_search", "read: searches (all threads)")
    _timed(MaskPrefetch, "result", "read: prefetch wait")
    _timed(Scheduler, "_finish_and_send", "read: finish+send")
    _timed(GrammarManager, "fill_bitmask", "fill rest", only_in_read=False)
    _timed(GrammarManager, "prefetch", "prefetch create", only_in_read=False)
    _timed(Stepping, "_sample", "sample launch", only_in_read=False)


def start() -> None:
    _MARKS.clear()
    _WAITS.clear()
    SEGMENTS.clear()
    _ON[0] = True


def stop() -> dict[str, float]:
    """Averages in ms over decode steps whose forward, sampling and next forward were marked."""
    _ON[0] = False
    torch.cuda.synchronize()
    m = list(_MARKS)
    _MARKS.clear()
    acc = {k: 0.0 for k in ("fwd", "wait samp", "samp", "idle", "launch fwd",
                            "fwd->samp launch", "samp->next fwd")}
    n = 0
    for i in range(len(m) - 4):
        kinds = [x[0] for x in m[i:i + 5]]
        if kinds != ["fwd0", "fwd1", "samp0", "samp", "fwd0"]:
            continue
        (_, h0, e0), (_, h1, e1), (_, h2, e2), (_, _, e3), (_, h4, e4) = m[i:i + 5]
        acc["fwd"] += e0.elapsed_time(e1)
        acc["wait samp"] += e1.elapsed_time(e2)
        acc["samp"] += e2.elapsed_time(e3)
        acc["idle"] += e3.elapsed_time(e4)
        acc["launch fwd"] += 1e3 * (h1 - h0)
        acc["fwd->samp launch"] += 1e3 * (h2 - h1)
        acc["samp->next fwd"] += 1e3 * (h4 - h2)
        n += 1
    out = {"steps": n, **{k: v / max(n, 1) for k, v in acc.items()}}
    out["ids wait"] = 1e3 * sum(_WAITS) / max(n, 1)
    _WAITS.clear()
    reads = max(1e3 * SEGMENTS.pop("reads", 0.0), 1)
    out.update({k: 1e3 * v / reads for k, v in SEGMENTS.items()})
    out["decode reads"] = reads
    SEGMENTS.clear()
    return out

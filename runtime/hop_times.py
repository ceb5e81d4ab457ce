"""Hop times: when each streamed chunk passed each hop on its way to the client (a debug aid).

An inter-token gap the client sees is the scheduler's step plus whatever every later hop added
(the main process receiving the step's outputs, building the chunk, the server's loop writing
it, the router forwarding it). With ``$SGDSL_HOP_TIMES=1`` in the environment of a server (and
of its router), each chunk of a streamed native ``/generate`` carries, in its ``meta_info``,
``hop_times``: wall-clock seconds (``time.time()``: comparable between the processes of one
machine) at

- ``sched``: the scheduler sent the outputs of the oldest step in the chunk
  (``BatchTokenOut.sent_at``),
- ``recv``: the TokenizerManager received them,
- ``detok``: the chunk was built (detokenized, on the engine's loop),
- ``server``: the server's loop encoded it for the response;

and ``hop_steps``: [the scheduler steps whose outputs the chunk carries, how many times its
text was held back (an incomplete character, a possible stop string)]: a chunk of several
steps without holds is one the main process took up late;

and a router forwarding the stream adds an SSE comment line ``: router <time>`` after each
event it passes on (clients ignore comments). ``benchmarks/gpu/bench_pd.py --hop-times``
reads them and reports, for the largest client gaps, which hop each gap was born in.

Also, while enabled, every process that imports this module reports garbage-collector pauses
of ``GC_REPORT_MS`` or more on stderr (``[hops] gc ...``), since a full collection is a pause
of every stream that process serves.
"""
from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any

ENV = "SGDSL_HOP_TIMES"
ENABLED = os.environ.get(ENV) == "1"
NAMES = ("sched", "recv", "detok", "server")  # the order of meta_info["hop_times"]
GC_REPORT_MS = 2.0


def now() -> float | None:
    """The time to stamp, or None when hop times are off (nothing is stamped then)."""
    return time.time() if ENABLED else None


def router_comment(t: float) -> bytes:
    """The SSE comment a router appends after an event it forwarded at ``t``."""
    return b": router %.6f\n\n" % t


def parse_router_comment(line: str) -> float | None:
    """``t`` of a ``: router t`` line (None for any other line)."""
    if not line.startswith(": router "):
        return None
    try:
        return float(line[9:])
    except ValueError:
        return None


class _GcWatch:
    """A ``gc.callbacks`` hook timing each collection; long ones go to stderr."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        ms = (time.perf_counter() - self.started) * 1e3
        if ms >= GC_REPORT_MS:
            print(f"[hops] gc {self.label} pid={os.getpid()} gen={info.get('generation')} "
                  f"ms={ms:.1f} at={time.time():.3f}", file=sys.stderr, flush=True)


def watch_gc(label: str) -> None:
    """Report this process's long collections (only while hop times are on)."""
    if ENABLED and not any(isinstance(cb, _GcWatch) for cb in gc.callbacks):
        gc.callbacks.append(_GcWatch(label))

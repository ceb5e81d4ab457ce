"""``pause_gc``: the cyclic garbage collector held off while a batch's programs start.

``run_batch`` of 256 programs allocates some 20k container objects (states, nodes, requests,
tasks) before its burst reaches the engine, and the collector ran in that phase: 25-30 young
collections, 2-3 middle ones and, every few batches, a full one, 12-130 ms in all per batch on
the 2-core dev box (one full collection: 82 ms), all of it on the path to the batch's hand-off,
while the engine had nothing to do (issue 29, batch 256; the Engine's own list call allocates
little there). Held off from the batch's start to its first finished program (``MAX_PAUSE_S``
at most), those collections run once the engine has the batch, beside its work. Reference
counting still frees everything acyclic at once; only cycles wait.

Counted: the first holder turns the collector off (if it was on), the last one restores what it
found, so nested or concurrent batches and a caller's own ``gc.disable()`` are respected.
"""
from __future__ import annotations

import gc
import threading
from typing import Callable

# a batch whose programs all run long gets its collector back after this (the start phase of
# 256 programs: ~0.05-0.1 s on a GPU host, up to ~1.3 s on the loaded 2-core dev box); 0: never
# pause (an A/B switch, as ``burst.MAX_HOLD_S``)
MAX_PAUSE_S = 2.0

_lock = threading.Lock()
_holders = 0
_was_enabled = False


def pause_gc() -> Callable[[], None]:
    """Hold the collector off; returns ``resume()``, which ends this hold once (later calls do
    nothing). The caller must call it (``Batch`` does: first result, cancel, or its timer)."""
    global _holders, _was_enabled
    if MAX_PAUSE_S <= 0:
        return lambda: None
    with _lock:
        _holders += 1
        if _holders == 1:
            _was_enabled = gc.isenabled()
            gc.disable()
    done = False

    def resume() -> None:
        nonlocal done
        global _holders
        with _lock:
            if done:
                return
            done = True
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
    return resume


def paused() -> bool:
    """Whether some hold is active (for tests and stats)."""
    with _lock:
        return _holders > 0

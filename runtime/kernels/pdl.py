"""Programmatic dependent launch (PDL, Hopper and later) for the batch-1 decode chain's kernels.

A kernel launched with PDL may start while the kernel before it on the stream is still running:
its launch and whatever it does before ``gdc_wait`` overlap the previous kernel's tail, where
most SMs idle waiting for the last blocks. At batch 1 each kernel moves only a few MB, so that
fixed cost (launch, ramp-up, tail: a few us) is a large share of a decode step.

The contract every kernel here keeps (``PDL`` constexpr on):
- ``enter(PDL)`` runs on every path of every program, before the program reads anything an
  earlier kernel may write and before it writes anything: ``gdc_wait`` returns only when the
  previous grid has completed and its memory is visible, and since that grid waited for its
  own predecessor the same way, every earlier kernel has completed too.
- Before ``enter`` a program reads only what no kernel of the step writes: weights (the
  matrix-vector products issue their first weight blocks' loads there, ``gemv.py``; how many:
  ``pre_blocks``).
- ``enter`` then lets the next kernel launch (``gdc_launch_dependents``): it starts once every
  program of this one has passed its wait (all of them resident), so its blocks fill SMs as
  this kernel's last blocks leave. (By default before the wait instead: ``early_trigger``;
  ``SGDSL_PDL_TRIGGER=wait`` for after it.)
A kernel that is not converted is launched without PDL and waits for its predecessor fully.

On by default where supported (a GPU of compute capability 9.0+, a Triton with ``gdc_wait`` and
the ``launch_pdl`` launch option, not the interpreter): measured on 4x H200 (RESULTS.md,
"PDL"), Llama-3.1-8B batch-1 decode at TP=4 498.9 -> 536.0 tok/s, TP=1 253.0 -> 254.3, with
the same bits (the GPU tests). ``SGDSL_PDL=0`` turns it off;
``SGDSL_PDL_ALL_REDUCE=0`` leaves the barrier-free all-reduce out (it spins on its peers' stores).
"""
from __future__ import annotations

import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

try:  # Triton >= 3.3 (older ones: no PDL, the kernels run as before)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    _HAS_GDC = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    _HAS_GDC = False

if _HAS_GDC and not _INTERPRET:
    @triton.jit
    def enter(PDL: tl.constexpr):
        """Wait for the previous grid (its memory visible), then let the next one launch
        (``PDL == EARLY``: let it launch first, then wait)."""
        if PDL == 2:
            gdc_launch_dependents()
            gdc_wait()
        elif PDL:
            gdc_wait()
            gdc_launch_dependents()
else:
    # NOTE: the interpreter has no gdc_* (and runs grids one after another anyway): a no-op, so
    # CPU tests still run the PDL variants' code (the loads issued before the wait)
    @triton.jit
    def enter(PDL: tl.constexpr):
        """No PDL here: nothing to wait for."""
        pass

_forced: bool | None = None


def _env_on(name: str, default: str) -> bool:
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes", "on")


def _launch_option() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover
        return False
    return "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}


@functools.lru_cache(maxsize=None)
def supported(device_index: int) -> bool:
    """Whether PDL launches work on this CUDA device with this Triton."""
    if _INTERPRET or not _HAS_GDC or not _launch_option():
        return False
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


@functools.lru_cache(maxsize=1)
def _requested() -> bool:
    return _env_on("SGDSL_PDL", "1")


def set_enabled(on: bool | None) -> None:
    """Force PDL on or off in this process (tests, A/B benchmarks); None: back to SGDSL_PDL.
    A CUDA graph keeps the launches it was captured with."""
    global _forced
    _forced = on


def enabled(x: torch.Tensor) -> bool:
    """Whether kernels working on ``x`` launch with PDL."""
    want = _requested() if _forced is None else _forced
    if want and _INTERPRET:  # CPU tests: the PDL variants' code, ``enter`` a no-op
        return True
    return want and x.is_cuda and supported(x.device.index or 0)


def all_reduce_enabled(x: torch.Tensor) -> bool:
    """PDL for the barrier-free all-reduce too (``SGDSL_PDL_ALL_REDUCE``, on by default)."""
    return enabled(x) and _env_on("SGDSL_PDL_ALL_REDUCE", "1")


PRE_DEFAULTS = {"SGDSL_GEMV_PRE": 4, "SGDSL_GEMV_PAIRS_PRE": 2}


def pre_blocks(k: int, block_k: int, on: bool, env: str = "SGDSL_GEMV_PRE") -> int:
    """How many weight blocks (of ``block_k`` elements, along ``k``) each matrix-vector program
    loads before PDL's wait: ``env`` (``SGDSL_GEMV_PRE`` for ``gemv.py``, default 4;
    ``SGDSL_GEMV_PAIRS_PRE`` for ``gemv_pairs.py``, default 2; 1: as first built), within the
    row's blocks; 1 without PDL (the kernel's one variant then).
    Why more than one: the weights do not depend on the kernel before, so a program can hold
    several blocks in registers while that kernel (above all the all-reduce's wait for its
    peers) finishes; each block costs a thread 16 bytes of registers per row (fewer programs
    resident at once). Measured (4x H200, ``bench_tp_chain.py``, Llama-3.1-8B TP=4 decode step,
    graph alone): 1/1 blocks 1721 us, 4/2 1706, 4/4 1734, 8/4 1734 (the pair kernel at 4
    blocks: 56 registers a thread, 9 programs an SM instead of 12); 70B TP=4: 4/2 = 1/1
    (10240 us), 8/8 10410."""
    if not on:
        return 1
    try:
        want = int(os.environ.get(env, PRE_DEFAULTS.get(env, 1)))
    except ValueError:
        want = 1
    return max(1, min(want, triton.cdiv(k, block_k)))


EARLY = 2  # the ``PDL`` constexpr's value for "launch the next grid before waiting"


def early_trigger() -> bool:
    """``SGDSL_PDL_TRIGGER`` (default ``early``): each kernel lets the next one launch before
    its own wait (``wait``: after it, as first built). Correct either way (a grid's wait still returns only once
    the grid before it has completed, and that one completed only after its own predecessor;
    before its wait a program reads only weights), and no deadlock: a grid launches only once
    every program of the one before has started. Early, a chain of small grids (the all-
    reduce, qkv, attention's two stages) gets its successors resident sooner, so e.g. o_proj's
    weight blocks stream during attention rather than after it; the cost: waiting programs
    hold SM slots that the running grid's later programs could have used. Measured (4x H200,
    ``bench_tp_chain.py``, Llama-3.1-8B TP=4 decode step on the graph alone, same logits bits):
    1720 -> 1663 us; with ``SGDSL_ATTN_PRE`` too 1640 us."""
    return os.environ.get("SGDSL_PDL_TRIGGER", "early").strip().lower() == "early"


def launch(on: bool) -> dict:
    """The launch keywords for a kernel with ``PDL=on``: ``launch_pdl`` only when on, so a
    Triton without the option never sees it (``PDL`` is ``EARLY`` with ``early_trigger``)."""
    if not on:
        return {"PDL": False}
    return {"PDL": EARLY if early_trigger() else True, "launch_pdl": True}

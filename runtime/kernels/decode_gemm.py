"""Decode-sized GEMMs (a few rows times a large weight): one row goes to the matrix-vector
kernel (gemv.py); more rows to cuBLAS or the Triton skinny GEMM (with or without split-K),
whichever is fastest for the shape, decided once per (rows bucket, N, K, weight format) on this
device.

Why: at batch 1 every linear layer is one weight read, and no single kernel shape streams every
matrix at full bandwidth (measured on an H100, 2026-11-24, in a Llama-3.1-8B decode step: the
o_proj (4096 x 4096) ran at 1.7 TB/s in cuBLAS against 2.85 TB/s for the larger projections;
the fp8 skinny GEMM without split-K read down_proj (K = 14336) at 1.8 TB/s). Candidates are
timed in eager mode with the L2 cache flushed before each run (inside a model step the weights
are never in L2; timing one matrix in a loop would measure the cache). The CUDA-graph warm-up
runs every decode shape before capture; during a capture an unseen shape takes the default
(cuBLAS, or split 1). ``SGDSL_DECODE_GEMM=<candidate>`` forces one (benchmarks)."""
from __future__ import annotations

import json
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .fp8_matmul import w8a16_matmul
from .gemv import Tile, default_tile, gemv

DECODE_ROWS = 16  # rows up to which the choice is made (decode batches)
SPLITS = (1, 2, 4)
_CHOICE: dict[tuple, str] = {}
_FLUSH: dict[int, torch.Tensor] = {}


def _bucket(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


def _time(fn: Callable[[], torch.Tensor], device: torch.device, iters: int = 8) -> float:
    idx = device.index or 0
    if idx not in _FLUSH:
        # NOTE: a normal tensor even when first timed inside inference mode (a runner's
        # forward): an inference tensor cannot be zeroed by a later call outside it
        with torch.inference_mode(False):
            _FLUSH[idx] = torch.empty(256 << 20, dtype=torch.uint8, device=device)  # > any L2
    flush = _FLUSH[idx]
    fn()
    fn()  # compile / autotune / cuBLAS heuristics out of the way
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    total = 0.0
    for _ in range(iters):
        flush.zero_()
        start.record()
        fn()
        end.record()
        end.synchronize()
        total += start.elapsed_time(end)
    return total


def _names(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
           block: tuple[int, int] | None) -> list[str]:
    """The timed candidates that can compute this product."""
    if scale is None and w.dtype == torch.float32:
        # NOTE: the Triton GEMM's fp32 dot runs in tf32: picked by timing, it made fp32
        # runs (parity checks) differ from HF by ~1e-3 in some processes and not others
        return ["cublas"]
    return (["cublas"] if scale is None else []) + [f"triton_split{s}" for s in SPLITS]


def _one_row(x: torch.Tensor, w: torch.Tensor, block: tuple[int, int] | None) -> str | None:
    """One row of a plain bf16/fp16 or per-channel fp8 weight: the matrix-vector kernel, no
    timing. NOTE: one matrix timed alone (L2 flushed, as ``_time``) is a poor guide at one
    row (H100, 2026-11-24: fp8 o_proj alone 36 us in the skinny GEMM vs 13 us in the
    matrix-vector kernel, 2.7x, while all four projections of 32 layers back to back in a CUDA
    graph took 3.41 vs 2.71 ms, 1.26x; picks by such timings moved the Engine's fp8 decode by
    2%), so the tiles come from 32-layer chains (benchmarks/gpu/sweep_gemv.py).
    ``SGDSL_DECODE_GEMM_TABLE`` (a JSON file of ``"N,K,element bytes": candidate``) overrides
    the rule per shape (tuning runs)."""
    if x.shape[0] != 1 or block is not None or w.dtype == torch.float32:
        return None
    table = os.environ.get("SGDSL_DECODE_GEMM_TABLE")
    if table:
        with open(table) as f:
            pick = json.load(f).get(f"{w.shape[0]},{w.shape[1]},{w.element_size()}")
        if pick is not None:
            return pick
    return "gemv"


def _run(name: str, x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
         block: tuple[int, int] | None) -> torch.Tensor:
    """One candidate by name: ``cublas``, ``triton_split<S>``, ``gemv`` (the shape's default
    tile) or ``gemv:<BLOCK_N>,<BLOCK_K bytes>,<warps>``."""
    if name == "cublas":
        return F.linear(x, w)
    if name.startswith("gemv"):
        return gemv(x, w, scale, _gemv_tile(name, w))
    return w8a16_matmul(x, w, scale, block, split_k=int(name.removeprefix("triton_split")))


def _gemv_tile(name: str, w: torch.Tensor) -> Tile:
    if ":" in name:
        bn, kb, warps = (int(v) for v in name.split(":")[1].split(","))
        return bn, kb, warps
    return default_tile(w.shape[0], w.shape[1], w.element_size())


def one_row_tile(w: torch.Tensor, block: tuple[int, int] | None = None) -> Tile | None:
    """The matrix-vector tile ``decode_linear`` uses for one row times ``w``, or None where
    it may use another kernel (fp32 or block-scaled weights, a table's pick, any forced
    candidate but ``gemv``): for callers that fuse neighbouring ops into that kernel."""
    forced = os.environ.get("SGDSL_DECODE_GEMM", "auto")
    if forced != "auto":
        return _gemv_tile(forced, w) if forced.startswith("gemv") and block is None else None
    name = _one_row(torch.empty(1, w.shape[1], device="meta"), w, block)
    return None if name is None or not name.startswith("gemv") else _gemv_tile(name, w)


def _choose(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
            block: tuple[int, int] | None) -> str | None:
    forced = os.environ.get("SGDSL_DECODE_GEMM", "auto")
    names = _names(x, w, scale, block)
    if forced in names or (forced.startswith("gemv") and x.shape[0] == 1 and block is None):
        return forced
    one_row = _one_row(x, w, block)
    if one_row is not None:
        return one_row
    if torch.cuda.is_current_stream_capturing():
        return None  # no timing inside a capture
    times = {name: _time(lambda name=name: _run(name, x, w, scale, block), x.device)
             for name in names}
    return min(times, key=times.get)


def decode_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                  scale: torch.Tensor | None = None,
                  block: tuple[int, int] | None = None) -> torch.Tensor:
    """``x [m <= DECODE_ROWS, K] @ W^T (+ bias)`` on CUDA by the fastest path for the shape;
    ``scale``/``block``: an fp8 weight's per-channel or block scales (None: plain weight)."""
    x = x.contiguous()
    key = (_bucket(x.shape[0]), w.shape[0], w.shape[1], w.dtype, block, x.device.index)
    choice = _CHOICE.get(key)
    if choice is None:
        choice = _choose(x, w, scale, block)
        if choice is not None:
            _CHOICE[key] = choice
    if choice is None:
        choice = "cublas" if scale is None else "triton_split1"
    if choice == "cublas":
        return F.linear(x, w, bias)
    out = _run(choice, x, w, scale, block)
    return out if bias is None else out + bias


def choices() -> dict[tuple, str]:
    """The decisions made so far (for benchmarks and logs)."""
    return dict(_CHOICE)

"""Decode-sized GEMMs (a few rows times a large weight): cuBLAS or the Triton skinny GEMM,
whichever is faster for the shape, decided once per (rows bucket, N, K) on this device.

Why: at batch 1 every linear layer is a weight read, and cuBLAS's choice for some shapes leaves
bandwidth unused (measured on an H100, 2026-11-24: Llama-3.1-8B's o_proj, 4096 x 4096, ran at
1.63 TB/s against 2.85 for the larger projections: 64 output tiles on 132 SMs). The choice is
timed in eager mode (the CUDA-graph warm-up runs every decode shape before capture); during a
capture an unseen shape falls back to cuBLAS. ``SGDSL_DECODE_GEMM=cublas|triton`` forces one.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from .fp8_matmul import w8a16_matmul

DECODE_ROWS = 16  # rows up to which the choice is made (decode batches)
_CHOICE: dict[tuple, str] = {}


def _bucket(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


def _time(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _choose(x: torch.Tensor, w: torch.Tensor) -> str:
    forced = os.environ.get("SGDSL_DECODE_GEMM", "auto")
    if forced in ("cublas", "triton"):
        return forced
    if torch.cuda.is_current_stream_capturing():
        return "cublas"  # no timing inside a capture; not cached, a later eager call decides
    t_cublas = _time(lambda: F.linear(x, w))
    t_triton = _time(lambda: w8a16_matmul(x, w, None))
    return "triton" if t_triton < 0.97 * t_cublas else "cublas"


def decode_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` for ``x [m <= DECODE_ROWS, K]`` on CUDA, by the faster path."""
    key = (_bucket(x.shape[0]), w.shape[0], w.shape[1], w.dtype, x.device.index)
    choice = _CHOICE.get(key)
    if choice is None:
        choice = _choose(x.contiguous(), w)
        if not torch.cuda.is_current_stream_capturing():
            _CHOICE[key] = choice
    if choice == "cublas":
        return F.linear(x, w, bias)
    out = w8a16_matmul(x.contiguous(), w, None)
    return out if bias is None else out + bias


def choices() -> dict[tuple, str]:
    """The decisions made so far (for benchmarks and logs)."""
    return dict(_CHOICE)

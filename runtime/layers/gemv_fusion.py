"""Batch-1 decode on the GPU: a decoder layer's RMSNorms and residual adds folded into the
matrix-vector products beside them (``kernels/gemv.py``), two launches fewer per layer.

A pre-norm layer computes ``s = x + residual; qkv(norm(s)) ... s' = o(attn) + s; gate_up(norm(s'))
... down(act) + s'``. At one row every matrix-vector program loads the whole input vector, so the
norm costs each program one more fp32 multiply-add per element (``gemv(norm=...)``), and the
residual add is one more load per output element (``gemv(residual=...)``): the o_proj and
down_proj kernels write the residual stream itself. Two separate RMSNorm launches per layer
(~2 us each on an H100, 64 per Llama-3.1-8B step) go away.

Used where the structure allows it: one row, the Triton path, tensor parallel size 1 (a row-
parallel product must be all-reduced before the add), and weights ``decode_linear`` would give
the matrix-vector kernel anyway (plain bf16/fp16, or fp8 with per-channel scales).

Opt-in (``SGDSL_GEMV_FUSION=1``) until measured faster. NOTE: the first version (one row a
program, the default tiles, norms folded into both qkv and gate_up) ran Llama-3.1-8B's Engine
decode at 275.3 tok/s fp8 vs 290.4 without it, and 181.8 vs 182.2 bf16 (H100, 2026-11-24,
same call): 64 norm launches fewer, but the fp8 products took ~300 us more per step (the norm
costs each program ~3 instructions per weight element, as many as x's own, and the fp8 kernel
is bound by instructions more than bytes). Since then x's squares are summed per element from
x loaded once per program, and the norm is folded only where ``norm_tile`` names a tile
(a ``SGDSL_DECODE_GEMM_TABLE`` from ``benchmarks/gpu/sweep_norm_gemv.py``, where several rows
a program share x's work): not yet measured on a GPU.
"""
from __future__ import annotations

import json
import os

import torch

from ..kernels.dispatch import use_triton
from .linear import ColumnParallelLinear, LinearBase
from .norm import RMSNorm
from .quantization.base import UnquantizedLinearMethod

Gemv = tuple[torch.Tensor, torch.Tensor | None, tuple[int, int, int]]  # weight, scale, tile


def enabled(x: torch.Tensor) -> bool:
    """Whether ``x`` (a layer's input rows) is a batch-1 decode row on the Triton path."""
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and use_triton(x) and os.environ.get("SGDSL_GEMV_FUSION", "") in ("1", "true"))


def gemv_args(linear: LinearBase, norm: bool = False, sharded: bool = False) -> Gemv | None:
    """(weight, per-channel scale or None, tile) where ``linear`` runs one row through the
    matrix-vector kernel at tensor-parallel size 1; None otherwise. ``norm``: the tile with an
    RMSNorm folded in (``norm_tile``), None where the separate norm kernel is the faster.
    ``sharded``: a column-parallel layer (not gathered) at any TP size too: its rank's product
    is a plain one-row product of its rows (an epilogue over output rows stays correct; a
    residual add into a row-parallel product would not, so those stay None).
    Memoized on the layer (eager decode asks every step) until the weight or the GEMM
    overrides change."""
    key = (linear.weight.data_ptr(), norm, sharded, os.environ.get("SGDSL_DECODE_GEMM"),
           os.environ.get("SGDSL_DECODE_GEMM_TABLE"))
    memo = linear.__dict__.setdefault("_gemv_args", {})
    if key not in memo:
        memo.clear()
        memo[key] = _gemv_args(linear, norm, sharded)
    return memo[key]


def norm_tile(w: torch.Tensor) -> tuple[int, int, int] | None:
    """The matrix-vector tile with an RMSNorm folded in, for one row times ``w``, or None
    (keep the norm kernel): as a ``SGDSL_DECODE_GEMM_TABLE`` names it (``"norm:N,K,element
    bytes": "gemv:BLOCK_N,BLOCK_K bytes,warps"`` or ``"off"``; ``sweep_norm_gemv.py`` writes
    one), None for shapes it does not name."""
    table = os.environ.get("SGDSL_DECODE_GEMM_TABLE")
    if not table:
        return None
    with open(table) as f:
        pick = json.load(f).get(f"norm:{w.shape[0]},{w.shape[1]},{w.element_size()}")
    if pick is None or pick == "off":
        return None
    return tuple(int(v) for v in pick.split(":")[1].split(","))


def _gemv_args(linear: LinearBase, norm: bool, sharded: bool) -> Gemv | None:
    from ..kernels.decode_gemm import one_row_tile
    from .quantization.fp8 import Fp8LinearMethod

    method, w = linear.quant_method, linear.weight
    local = linear.tp_size == 1 or (sharded and isinstance(linear, ColumnParallelLinear)
                                    and not linear.gather_output)
    if not local or w.dim() != 2:
        return None
    if isinstance(method, UnquantizedLinearMethod) and w.element_size() == 2:
        scale = None
    elif isinstance(method, Fp8LinearMethod) and method.block is None and w.element_size() == 1:
        scale = linear.weight_scale
    else:
        return None
    tile = one_row_tile(w)
    if tile is not None and norm:
        tile = norm_tile(w)
    return None if tile is None else (w, scale, tile)


def norm_linear(x: torch.Tensor, norm: RMSNorm, linear: LinearBase,
                args: Gemv | None) -> torch.Tensor:
    """``linear(norm(x))`` for one row, in one launch where ``args`` (``gemv_args(linear,
    norm=True)``) is given."""
    from ..kernels.gemv import gemv

    if args is None:
        return linear(norm(x))
    w, scale, tile = args
    return gemv(x, w, scale, tile, norm=(norm.weight, norm.eps), bias=linear.bias)


def linear_add(x: torch.Tensor, linear: LinearBase, residual: torch.Tensor,
               args: Gemv) -> torch.Tensor:
    """``linear(x) + residual`` for one row in one launch (``args`` from ``gemv_args``)."""
    from ..kernels.gemv import gemv

    w, scale, tile = args
    return gemv(x.contiguous(), w, scale, tile, bias=linear.bias, residual=residual)

"""Batch-1 decode on the GPU: the op after a packed projection run as that product's epilogue
(``kernels/gemv_pairs.py``), one launch fewer each, on by default.

- gate_up -> SiLU-and-mul: ``LlamaMLP`` at one row.
- qkv -> rotary (+ the KV store where the attention backend offers a ``kv_store_target``):
  ``LlamaAttention`` at one token without q/k norms (Llama, Mistral, Mixtral, Qwen2).

Where the structure allows it, as ``gemv_fusion``: one row, bf16/fp16 activations, the Triton
path, and weights ``decode_linear`` would give the matrix-vector kernel anyway (plain bf16/fp16,
or fp8 with per-channel scales). Under tensor parallelism too (both products are column-
parallel: a rank's gate and up rows pair up, as do the rotary halves of its own heads, and its
KV pool holds its kv heads): two launches fewer per layer at TP=2/4/8, where each launch weighs
more against ~4x smaller products; ``SGDSL_GEMV_EPILOGUE_TP=0`` keeps the separate kernels
there (first written for tp 1 only). Each separate kernel cost ~1.2-1.3 us
plus a ~0.4 us launch gap per layer in a Llama-3.1-8B step (H100, 2026-11-24 profiles); with
the epilogues the fp8 step's products + epilogues took 2860 us of kernels against 2966 us
(H100, 2026-11-26, ``profile_decode.py``). ``SGDSL_GEMV_EPILOGUE=0`` turns it off
(comparisons on one tree).
"""
from __future__ import annotations

import functools
import json
import os

import torch

from ..kernels.dispatch import use_triton
from . import gemv_fusion
from .linear import LinearBase
from .norm import RMSNorm

Rope = tuple[torch.Tensor, torch.Tensor]


def enabled(x: torch.Tensor) -> bool:
    """Whether ``x`` (a product's input rows) is one bf16/fp16 row on the Triton path."""
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and use_triton(x) and os.environ.get("SGDSL_GEMV_EPILOGUE", "1") not in ("0", "false"))


def _sharded() -> bool:
    """Whether the epilogues also run on a TP rank's shard (``SGDSL_GEMV_EPILOGUE_TP``)."""
    return os.environ.get("SGDSL_GEMV_EPILOGUE_TP", "1") not in ("0", "false")


def _pair_tile(args: gemv_fusion.Gemv, norm_args: gemv_fusion.Gemv | None
               ) -> tuple[int, int, int]:
    """The pair tile for the weight: a ``SGDSL_DECODE_GEMM_TABLE``'s ``"pairs:N,K,element
    bytes"`` entry (``benchmarks/gpu/sweep_gemv_pairs.py`` writes one), else the default; with
    a folded norm, the norm tile's rows as pairs."""
    from ..kernels.gemv_pairs import default_pair_tile

    if norm_args is not None:
        rows, block_bytes, warps = norm_args[2]
        return max(1, rows // 2), block_bytes, warps
    w = args[0]
    table = os.environ.get("SGDSL_DECODE_GEMM_TABLE")
    key = f"pairs:{w.shape[0]},{w.shape[1]},{w.element_size()}"
    pick = _table_pick(table, key) if table else None
    if pick is not None:
        return tuple(int(v) for v in pick.split(":")[1].split(","))
    return default_pair_tile(w.shape[0], w.element_size())


@functools.lru_cache(maxsize=64)
def _table_pick(table: str, key: str) -> str | None:
    with open(table) as f:
        return json.load(f).get(key)


def _norm(x: torch.Tensor, norm: RMSNorm | None, norm_args: gemv_fusion.Gemv | None
          ) -> tuple[torch.Tensor, tuple[torch.Tensor, float] | None]:
    """x for the product and the norm to fold into it: the norm applied here unless
    ``norm_args`` (``gemv_fusion.gemv_args(linear, norm=True)``) names a fused tile."""
    if norm is None:
        return x, None
    if norm_args is None:
        return norm(x), None
    return x, (norm.weight, norm.eps)


def gate_up_act(x: torch.Tensor, gate_up: LinearBase, norm: RMSNorm | None = None,
                norm_args: gemv_fusion.Gemv | None = None) -> torch.Tensor | None:
    """``silu_and_mul(gate_up(norm(x)))`` for one row in one launch (two with a norm that is
    not folded); None where the epilogue does not apply."""
    from ..kernels.gemv_pairs import gemv_silu

    args = gemv_fusion.gemv_args(gate_up, sharded=_sharded()) if enabled(x) else None
    if args is None:
        return None
    x, fold = _norm(x, norm, norm_args)
    return gemv_silu(x, args[0], args[1], _pair_tile(args, norm_args), norm=fold,
                     bias=gate_up.bias)


def qkv_rope(x: torch.Tensor, qkv: LinearBase, heads: tuple[int, int], rope: Rope, store: object,
             norm: RMSNorm | None = None, norm_args: gemv_fusion.Gemv | None = None
             ) -> torch.Tensor | None:
    """The qkv projection of one token (``heads``: its q and kv head counts) with q and k
    rotated and, with ``store`` (a ``KVStoreTarget``), k and v written to the KV pool:
    ``[1, (q_heads + 2 * kv_heads) * head_dim]``; None where the epilogue does not apply."""
    from ..kernels.gemv_pairs import gemv_rope

    args = gemv_fusion.gemv_args(qkv, sharded=_sharded()) if enabled(x) else None
    if args is None:
        return None
    x, fold = _norm(x, norm, norm_args)
    return gemv_rope(x, args[0], args[1], *heads, *rope, store, _pair_tile(args, norm_args),
                     norm=fold, bias=qkv.bias)

"""Matrix-vector product for batch-1 decode: ``x [1, K] @ W[N, K]^T`` with a plain (bf16/fp16)
or fp8 weight (E4M3, one scale per output channel), streaming the weight once at close to the
device's copy bandwidth.

Why not the skinny GEMM (fp8_matmul.py) at one row: ``tl.dot`` pads the row to 16, stages each
weight tile through shared memory in the dot's layout and needs BLOCK_N >= 16 columns per
program, so long-K matrices get few, long programs (Llama's down_proj: 128 programs on 132 SMs,
measured at 1.8 TB/s in fp8). Here each program owns a few output rows and walks their whole
K: every thread loads 16 contiguous weight bytes, widens them to fp32 and multiplies by x in
registers (no tensor cores: at one row the product is ~1 FLOP per weight byte), so a shape gets
N / BLOCK_N programs, thousands for any Llama matrix, no split-K partial sums and no extra
launches. The row sums are reduced once, at the end.

A tile is ``(BLOCK_N, BLOCK_K in weight bytes, num_warps)``. Triton's pipeliner does not stage
loads that feed no ``tl.dot`` (no ``num_stages`` here: checked in the SASS, 2026-11-24), so the
loads in flight are the block's. Measured and dropped (H100, 2026-11-24, 32-layer chains): the
next block loaded ahead (register double-buffering) and a partial sum per weight element
instead of per vector (fewer instructions in the SASS) were no faster.

With PDL (``pdl.py``, ``SGDSL_PDL=1``) each program issues its first weight blocks' loads
(``SGDSL_GEMV_PRE`` blocks, default 4: ``pdl.pre_blocks``) before waiting for the previous kernel, and x, the
residual and the output after: the weight, its scales and the bias must not be written by the
kernels of the step (parameters are not). The sums are the same in either case (the blocks are
added in the loop's order).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl

Tile = tuple[int, int, int]


def default_tile(n: int, k: int, elem: int) -> Tile:
    """The tile for an ``[n, k]`` weight of ``elem``-byte elements: one row per program, 2 KB
    of it per block; 4 warps for 2-byte weights (one vector a thread), 1 warp for fp8 (four).
    NOTE: from 71 tiles timed in 32-layer chains at the Llama-3.1-8B shapes (H100, 2026-11-24,
    ``benchmarks/gpu/sweep_gemv.py``): within 2% of each shape's best tile, bf16 and fp8; the
    best were all 1-2 rows a program and 1-2 KB blocks."""
    return (1, 2048, 4) if elem >= 2 else (1, 2048, 1)


@triton.jit
def _load_w(ptrs, mask, EVEN: tl.constexpr):
    # streamed once per step: keep it out of L2's way (evict first)
    if EVEN:
        w = tl.load(ptrs, eviction_policy="evict_first")
    else:
        w = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    return w


@triton.jit
def _load_x(X, NW, k0, K, offs_k, offs_rows, NORM: tl.constexpr, EVEN_K: tl.constexpr):
    """Block ``k0`` of x in fp32, in the weights' register layout (``offs_rows``: the
    program's rows), and its squares; with an RMSNorm folded in (``NORM``) x comes times the
    norm weight (1 / rms(x) is applied after the loop) and the squares are of x before it."""
    # NOTE: with the norm, x has shape [1, ...] and broadcasts to the rows; without it, its
    # pointers get the rows' shape (every row reads the same x, from L1)
    if NORM:
        x_offs = k0 + offs_k[None, :, :]
    else:
        x_offs = k0 + offs_k[None, :, :] + offs_rows[:, None, None] * 0
    if EVEN_K:
        x = tl.load(X + x_offs).to(tl.float32)
    else:
        x = tl.load(X + x_offs, mask=offs_k[None, :, :] < K - k0, other=0.0).to(tl.float32)
    x_sq = x  # unused without the norm (compiled away)
    if NORM:
        x_sq = x * x
        if EVEN_K:
            x = x * tl.load(NW + x_offs).to(tl.float32)
        else:
            x = x * tl.load(NW + x_offs, mask=offs_k[None, :, :] < K - k0,
                            other=0.0).to(tl.float32)
    return x, x_sq


@triton.jit
def _pre_blocks(w_ptrs, mask_rows, offs_k, K, PRE: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN: tl.constexpr):
    """The first ``PRE`` weight blocks of the rows at ``w_ptrs``, as a tuple: loads issued
    before PDL's wait (``pre_blocks``; the launcher keeps PRE within K's blocks)."""
    ws = ()
    for b in tl.static_range(PRE):
        mask = mask_rows & (offs_k[None, :, :] < K - b * BLOCK_K)
        ws = ws + (_load_w(w_ptrs + b * BLOCK_K, mask, EVEN),)
    return ws


@triton.jit
def _gemv_kernel(X, W, S, Out, NW, Bias, Res, N, K, stride_wn, eps, HAS_SCALE: tl.constexpr,
                 NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                 EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, VEC: tl.constexpr, PRE: tl.constexpr,
                 PDL: tl.constexpr):
    # Tiles are [BLOCK_N, BLOCK_K // VEC, VEC]: one 16-byte vector of a row on the last axis, so
    # each thread sums its own vector in registers and keeps BLOCK_K // VEC partial sums per
    # row, not BLOCK_K (the accumulator would otherwise cap the loads in flight per thread).
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = (tl.arange(0, BLOCK_K // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :])
    mask_n = offs_n[:, None, None] < N
    w_ptrs = W + offs_n[:, None, None].to(tl.int64) * stride_wn + offs_k[None, :, :]
    even: tl.constexpr = EVEN_N and EVEN_K
    acc = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    # NORM: x's squares summed per element (one FFMA each; the sum over the block is taken
    # once, after the loop) from x loaded once per program ([1, ...]: broadcast to the rows)
    sq = tl.zeros((1, BLOCK_K // VEC, VEC), dtype=tl.float32)
    k_first = 0
    if PDL:  # the first PRE blocks' weight loads in flight before the wait (pdl.py), x after
        ws = _pre_blocks(w_ptrs, mask_n, offs_k, K, PRE, BLOCK_K, even)
        w_ptrs += PRE * BLOCK_K
        pdl.enter(PDL)
        for b in tl.static_range(PRE):  # the loop's first PRE steps, the same sums in order
            x, x_sq = _load_x(X, NW, b * BLOCK_K, K, offs_k, offs_n, NORM, EVEN_K)
            if NORM:
                sq += x_sq
            acc += tl.sum(ws[b].to(tl.float32) * x, axis=2)
        k_first = PRE * BLOCK_K
    for k0 in range(k_first, K, BLOCK_K):
        w = _load_w(w_ptrs, mask_n & (offs_k[None, :, :] < K - k0), even)
        w_ptrs += BLOCK_K
        # NOTE: x's pointers have w's shape (every row reads the same x, from L1), so x is
        # loaded in w's register layout: no layout conversion through shared memory per block.
        # Recomputed from k0 each block: a version advancing them (and the loop reshaped) was
        # unrolled differently and ran 2-4% slower in fp8 chains (H100, 2026-11-24)
        x, x_sq = _load_x(X, NW, k0, K, offs_k, offs_n, NORM, EVEN_K)
        if NORM:
            sq += x_sq
        acc += tl.sum(w.to(tl.float32) * x, axis=2)
    out = tl.sum(acc, axis=1)
    if NORM:
        out = out / tl.sqrt(tl.sum(tl.sum(tl.sum(sq, axis=2), axis=1), axis=0) / K + eps)
    if HAS_SCALE:
        out = out * tl.load(S + offs_n, mask=offs_n < N, other=0.0)
    # rounded at each step as the unfused ops round (bias add, then residual add)
    out = out.to(Out.dtype.element_ty)
    if HAS_BIAS:
        b = tl.load(Bias + offs_n, mask=offs_n < N, other=0.0)
        out = (out.to(tl.float32) + b.to(tl.float32)).to(Out.dtype.element_ty)
    if HAS_RES:
        r = tl.load(Res + offs_n, mask=offs_n < N, other=0.0)
        out = (out.to(tl.float32) + r.to(tl.float32)).to(Out.dtype.element_ty)
    tl.store(Out + offs_n, out, mask=offs_n < N)


def gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None,
         tile: Tile | None = None, *, norm: tuple[torch.Tensor, float] | None = None,
         bias: torch.Tensor | None = None, residual: torch.Tensor | None = None
         ) -> torch.Tensor:
    """``x [1, K]`` (bf16/fp16/fp32) times ``w [N, K]``^T -> ``[1, N]`` in x's dtype. ``w`` is a
    plain weight (``scale=None``) or fp8 with ``scale [N]`` fp32 per output channel; ``tile``
    defaults to ``default_tile`` for the shape.

    Fused neighbours of a decoder layer (batch-1 decode: each saves a launch of ~2 us):
    ``norm=(weight [K], eps)`` multiplies ``RMSNorm(x)`` instead of x (the norm's weight is
    applied in fp32 and 1 / rms to the row sums: no rounding of the normalized x, unlike the
    separate kernel; every program sums x's squares from the x it loads anyway); ``bias [N]``
    is added, then ``residual [1, N]`` (each rounded to x's dtype, as separate adds are)."""
    assert x.dim() == 2 and x.shape[0] == 1, "gemv takes one row"
    n, k = w.shape
    assert x.shape[1] == k and x.stride(1) == 1 and w.stride(1) == 1
    if scale is not None:
        assert scale.shape == (n,) and scale.dtype == torch.float32 and scale.stride(0) == 1
    norm_w, eps = norm if norm is not None else (None, 0.0)
    for name, t, size in (("norm weight", norm_w, k), ("bias", bias, n),
                          ("residual", residual, n)):
        assert t is None or (t.numel() == size and t.is_contiguous()), f"{name}: {size} values"
    block_n, block_bytes, warps = tile or default_tile(n, k, w.element_size())
    block_k = block_bytes // w.element_size()
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    on = pdl.enabled(x)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, scale if scale is not None else w, out, _or(norm_w, w), _or(bias, w),
        _or(residual, w), n, k, w.stride(0), eps, HAS_SCALE=scale is not None,
        NORM=norm is not None, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        EVEN_N=n % block_n == 0, EVEN_K=k % block_k == 0, BLOCK_N=block_n, BLOCK_K=block_k,
        VEC=16 // w.element_size(), PRE=pdl.pre_blocks(k, block_k, on), num_warps=warps,
        num_stages=1, **pdl.launch(on))
    return out


def _or(t: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    return placeholder if t is None else t

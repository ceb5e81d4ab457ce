"""FP8 linear-layer kernels: a weight-only fp8 GEMM (fp8 weights widened to the activation
dtype in registers, scales per output channel or per 128x128 block) and the dynamic per-token
activation quantizer that feeds ``torch._scaled_mm``.

Why weight-only for small batches: a decode step is bound by reading the weights; an fp8 weight
is half the bytes of bf16 whatever the activation format, and skipping the activation quantizer
saves a launch per linear layer. Large batches are compute-bound and go through the fp8 tensor
cores (``_scaled_mm``) instead; block-scaled weights use this kernel at every size.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)


def _config(m: int, block_scaled: bool, weight_bytes: int) -> dict:
    """Tile shape by row count. NOTE: fixed shapes, not ``triton.autotune``: autotuning every
    (rows bucket, N, K, split) key cost ~1 minute per process start (measured on an H100,
    2026-11-24); the decode path picks among split-K variants itself (decode_gemm.py)."""
    if m <= 16:
        block_k = 128 if block_scaled or weight_bytes > 1 else 256
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=block_k, num_warps=4, num_stages=4)
    if m <= 64:
        return dict(BLOCK_M=32 if m <= 32 else 64, BLOCK_N=64, BLOCK_K=128, num_warps=4,
                    num_stages=4)
    return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3)


@triton.jit
def _w8a16_kernel(X, W, S, Out, M, N, K, stride_xm, stride_wn, stride_om,
                  stride_sn, stride_sk, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(0)
    # split-K: program (n, m, s) sums K range s; the partial sums meet in Out (fp32, atomics)
    chunk = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = tl.program_id(2) * chunk
    k_end = tl.minimum(K, k_start + chunk)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = X + offs_m[:, None].to(tl.int64) * stride_xm + k_start + offs_k[None, :]
    w_ptrs = W + offs_n[None, :].to(tl.int64) * stride_wn + k_start + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        mask_k = offs_k < k_end - k0
        x = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(x.dtype)
        if GROUP_K > 0:  # block scales: one per (GROUP_N rows, GROUP_K cols) of W
            s = tl.load(S + (offs_n // GROUP_N) * stride_sn + (k0 // GROUP_K) * stride_sk,
                        mask=mask_n, other=0.0)
            acc += tl.dot(x, w) * s[None, :]
        else:
            acc += tl.dot(x, w)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if GROUP_K == 0:  # per-channel scales (GROUP_K < 0: an unscaled bf16/fp16 weight)
        acc = acc * tl.load(S + offs_n * stride_sn, mask=mask_n, other=0.0)[None, :]
    o_ptrs = Out + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    if SPLIT_K > 1:
        tl.atomic_add(o_ptrs, acc, mask=mask_m[:, None] & mask_n[None, :])
    else:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def w8a16_matmul(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None,
                 block: tuple[int, int] | None = None, split_k: int = 1) -> torch.Tensor:
    """``x [M, K]`` (bf16/fp16) times fp8 ``w [N, K]``^T -> ``[M, N]`` in x's dtype; ``scale``
    is ``[N]`` (per channel) or ``[ceil(N/bn), ceil(K/bk)]`` with ``block=(bn, bk)``. With
    ``scale=None`` ``w`` is a plain weight in x's dtype (the decode GEMM, see decode_gemm.py).
    ``split_k`` > 1 splits the reduction over more programs (long K, few output columns: more
    loads in flight), summed in fp32 with atomics, then cast: two more launches."""
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and x.stride(1) == 1 and w.stride(1) == 1
    out = (torch.empty(m, n, dtype=x.dtype, device=x.device) if split_k == 1 else
           torch.zeros(m, n, dtype=torch.float32, device=x.device))
    if m == 0:
        return out.to(x.dtype)
    group_n, group_k = block if block is not None else (1, 0)
    if scale is None:
        group_k, scale, strides = -1, w, (0, 0)
    elif block is None:
        assert scale.shape == (n,) and scale.dtype == torch.float32, "per-channel scale: [N] fp32"
        strides = (scale.stride(0), 0)
    else:
        assert scale.shape == (triton.cdiv(n, group_n), triton.cdiv(k, group_k))
        strides = (scale.stride(0), scale.stride(1))
    cfg = _config(m, group_k > 0, w.element_size())
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]), split_k)
    _w8a16_kernel[grid](x, w, scale, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
                        *strides, GROUP_N=group_n, GROUP_K=group_k, SPLIT_K=split_k, **cfg)
    return out if split_k == 1 else out.to(x.dtype)


@triton.jit
def _per_token_quant_kernel(X, Q, S, K, stride_x, stride_q, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), 0) / FP8_MAX, 1e-12)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(Q + row * stride_q + offs, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, scale)


def per_token_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(q [M, K] fp8 e4m3, scale [M, 1] fp32)`` with ``x ~= q * scale``."""
    m, k = x.shape
    assert x.stride(1) == 1
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(k)
        _per_token_quant_kernel[(m,)](x, q, s, k, x.stride(0), q.stride(0), BLOCK=block,
                                      num_warps=8 if block >= 4096 else 4)
    return q, s

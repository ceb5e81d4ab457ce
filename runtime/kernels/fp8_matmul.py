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


def _configs() -> list[triton.Config]:
    out = []
    for bm, bn, bk, warps, stages in [(16, 32, 256, 4, 4), (16, 64, 128, 4, 4),
                                      (16, 32, 128, 4, 6), (16, 16, 256, 4, 4),
                                      (16, 16, 512, 4, 3), (16, 64, 256, 4, 3),
                                      (32, 64, 128, 4, 4), (64, 128, 128, 8, 3),
                                      (128, 128, 128, 8, 3)]:
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
                                 num_warps=warps, num_stages=stages))
    return out


def _prune(configs, named_args, **kwargs):
    """Row blocks no taller than the batch needs; block scales need BLOCK_K | GROUP_K."""
    m_bucket, group_k = named_args["m_bucket"], kwargs.get("GROUP_K", 0)
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= max(16, m_bucket)
            and (group_k <= 0 or group_k % c.kwargs["BLOCK_K"] == 0)]
    return kept or configs[:1]


# NOTE: restore_value: with SPLIT_K > 1 the kernel accumulates into Out (atomic adds), so the
# autotuner's trial runs must not leave their sums behind for the real run.
@triton.autotune(configs=_configs(), key=["m_bucket", "N", "K", "GROUP_K", "SPLIT_K"],
                 prune_configs_by={"early_config_prune": _prune}, restore_value=["Out"])
@triton.jit
def _w8a16_kernel(X, W, S, Out, M, N, K, m_bucket, stride_xm, stride_wn, stride_om,
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
    m_bucket = min(triton.next_power_of_2(m), 256)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, meta["BLOCK_M"]),  # noqa: E731
                         split_k)
    _w8a16_kernel[grid](x, w, scale, out, m, n, k, m_bucket, x.stride(0), w.stride(0),
                        out.stride(0), *strides, GROUP_N=group_n, GROUP_K=group_k,
                        SPLIT_K=split_k)
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

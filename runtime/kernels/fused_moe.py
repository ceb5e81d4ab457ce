"""Fused MoE: two grouped GEMMs over expert-sorted tokens.

``align_by_expert`` (layers/moe/align.py) orders the ``T * top_k`` (token, expert) pairs by
expert, each expert's run padded to ``BLOCK_M`` rows, so one program's row block reads one
expert's weights. GEMM 1 computes the gate and up tiles of the same output columns together and
writes ``silu(gate) * up`` (the activation fused, no ``[T*k, 2I]`` intermediate); GEMM 2
multiplies by ``W2`` and by each pair's routing weight; the k rows of a token are then summed.

Weights may be fp8 (E4M3) with one scale per output channel (``[E, N]``) or per
``GROUP_N x GROUP_K`` block (``[E, N/GROUP_N, K/GROUP_K]``); they are widened to the
activation dtype in registers (weight-only fp8: decode reads half the bytes, the tensor-core
math stays bf16).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SCALE_NONE, SCALE_CHANNEL, SCALE_BLOCK = 0, 1, 2


@triton.jit
def _moe_gemm_kernel(
    A, B, C, B_scale, Topk_w, Sorted_ids, Block_expert, Num_padded,
    N, K, num_pairs, num_experts,
    stride_am, stride_be, stride_bn, stride_cm, stride_se, stride_sn, stride_sk,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    SCALE: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    if pid_m * BLOCK_M >= tl.load(Num_padded):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(Sorted_ids + offs_m)
    valid = ids < num_pairs
    expert = tl.load(Block_expert + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    if expert >= num_experts:  # skipped pairs (expert id E): zero rows, no weights read
        c_ptrs = C + ids[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=C.dtype.element_ty),
                 mask=valid[:, None] & mask_n[None, :])
        return
    a_rows = (ids // A_ROW_DIV).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + a_rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = B + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0).to(a.dtype)
        part = tl.dot(a, b)
        if GATED:
            bu = tl.load(b_ptrs + N * stride_bn, mask=mask_k[:, None] & mask_n[None, :],
                         other=0.0).to(a.dtype)
            part_up = tl.dot(a, bu)
        if SCALE == 2:
            s_ptrs = B_scale + expert * stride_se + (k0 // GROUP_K) * stride_sk
            s = tl.load(s_ptrs + (offs_n // GROUP_N) * stride_sn, mask=mask_n, other=0.0)
            part = part * s[None, :]
            if GATED:
                su = tl.load(s_ptrs + ((offs_n + N) // GROUP_N) * stride_sn, mask=mask_n, other=0.0)
                part_up = part_up * su[None, :]
        acc += part
        if GATED:
            acc_up += part_up
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if SCALE == 1:
        s_ptrs = B_scale + expert * stride_se + offs_n * stride_sn
        acc = acc * tl.load(s_ptrs, mask=mask_n, other=0.0)[None, :]
        if GATED:
            acc_up = acc_up * tl.load(s_ptrs + N * stride_sn, mask=mask_n, other=0.0)[None, :]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if MUL_WEIGHT:
        w = tl.load(Topk_w + ids, mask=valid, other=0.0)
        acc = acc * w[:, None]
    c_ptrs = C + ids[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=valid[:, None] & mask_n[None, :])


@triton.jit
def _combine_kernel(Y, Out, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(Y + (tok * TOP_K + j) * hidden + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + tok * hidden + offs, acc.to(Out.dtype.element_ty), mask=mask)


def combine(y: torch.Tensor, tokens: int, top_k: int) -> torch.Tensor:
    """Sum each token's k weighted expert rows: ``y [T * k, H] -> [T, H]`` (fp32 sums; the
    torch reduction over the middle dim took ~5 us at batch 1, this ~2)."""
    hidden = y.shape[1]
    out = torch.empty(tokens, hidden, dtype=y.dtype, device=y.device)
    block = min(triton.next_power_of_2(hidden), 1024)
    _combine_kernel[(tokens, triton.cdiv(hidden, block))](y, out, hidden, TOP_K=top_k,
                                                          BLOCK=block, num_warps=4)
    return out


def pick_block_m(num_pairs: int, num_experts: int) -> int:
    """Row block: small when each expert gets few rows (decode), larger for prefill."""
    per_expert = num_pairs / max(num_experts, 1)
    return 16 if per_expert <= 16 else 32 if per_expert <= 48 else 64


def _scale_args(scale: torch.Tensor | None, block: tuple[int, int] | None):
    if scale is None:
        return SCALE_NONE, (0, 0, 0), (1, 1)
    if block is None:
        assert scale.dim() == 2, "per-channel scale: [E, N]"
        return SCALE_CHANNEL, (scale.stride(0), scale.stride(1), 0), (1, 1)
    assert scale.dim() == 3, "block scale: [E, N / bn, K / bk]"
    return SCALE_BLOCK, (scale.stride(0), scale.stride(1), scale.stride(2)), block


def moe_gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, b_scale: torch.Tensor | None,
             block: tuple[int, int] | None, topk_weights: torch.Tensor | None,
             align, num_pairs: int, a_row_div: int, gated: bool) -> None:
    """One grouped GEMM: ``c[pair] = a[pair // a_row_div] @ b[expert(pair)]^T`` (gated: the
    SwiGLU of the gate and up halves of b), times ``topk_weights[pair]`` when given."""
    e, n_total, k = b.shape
    n = n_total // 2 if gated else n_total
    assert a.stride(1) == 1 and b.stride(2) == 1 and c.stride(1) == 1 and a.shape[1] == k
    assert c.shape == (num_pairs, n)
    mode, strides, (group_n, group_k) = _scale_args(b_scale, block)
    block_k = min(group_k, 128) if mode == SCALE_BLOCK else 64 if not a.is_cuda else 128
    block_n = 64 if not a.is_cuda else (64 if align.block_m >= 32 else 32)
    # NOTE: one weight scale per K step: the K block must not straddle a scale block.
    assert mode != SCALE_BLOCK or group_k % block_k == 0
    grid = (align.sorted_ids.shape[0] // align.block_m * triton.cdiv(n, block_n),)
    _moe_gemm_kernel[grid](
        a, b, c, b_scale if b_scale is not None else c, topk_weights if topk_weights is not None
        else c, align.sorted_ids, align.block_expert, align.num_padded,
        n, k, num_pairs, e,
        a.stride(0), b.stride(0), b.stride(1), c.stride(0), *strides,
        A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=topk_weights is not None,
        SCALE=mode, GROUP_N=group_n, GROUP_K=group_k,
        BLOCK_M=align.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4, num_stages=3 if a.is_cuda else 1,
    )


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None,
              block: tuple[int, int] | None = None, sum_experts: bool = True) -> torch.Tensor:
    """``x [T, H]``, ``w13 [E, 2I, H]``, ``w2 [E, H, I]``, routing ``[T, k]`` -> ``[T, H]``;
    ``sum_experts=False``: ``[T, k, H]``, the weighted rows before the combine (a fused
    add+RMSNorm sums them, see ``kernels/rmsnorm.py``). An id equal to E marks a skipped pair
    (expert parallelism: padding, or another rank's expert): no expert computes it and it
    adds zero to its token."""
    from ..layers.moe.align import PAIR_BLOCKS_MAX, align_by_expert, align_pairs

    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, two_inter, _ = w13.shape
    assert w2.shape == (num_experts, hidden, two_inter // 2), "w2 must be [E, H, I]"
    pairs = tokens * top_k
    if tokens == 0:
        return x.new_empty((0, hidden) if sum_experts else (0, top_k, hidden))
    if pairs <= PAIR_BLOCKS_MAX:
        align = align_pairs(topk_ids, 16)
    else:
        # one bucket more: padding pairs (id E) sort after the real ones and are skipped
        align = align_by_expert(topk_ids, num_experts + 1, pick_block_m(pairs, num_experts))
    inter = torch.empty(pairs, two_inter // 2, dtype=x.dtype, device=x.device)
    moe_gemm(x, w13, inter, w13_scale, block, None, align, pairs, top_k, gated=True)
    out = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    moe_gemm(inter, w2, out, w2_scale, block, topk_weights.reshape(-1).float().contiguous(),
             align, pairs, 1, gated=False)
    return combine(out, tokens, top_k) if sum_experts else out.view(tokens, top_k, hidden)

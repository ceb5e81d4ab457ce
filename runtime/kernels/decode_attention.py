"""Decode attention over the paged token pool: one query token per request.

Split-K (flash-decoding): stage 1 splits each request's sequence into up to ``max_kv_splits``
chunks and writes, per (request, head, split), an unnormalized partial output and its
log-sum-exp; stage 2 merges the splits. GQA-aware: one program of stage 1 handles every query
head of one KV head (padded to 16 rows for ``tl.dot``), so each K/V row is read once per group.

All launch shapes depend only on the batch size and ``max_kv_splits``, and the per-request split
count is a device tensor or computed in stage 1 from the length, so both stages can be captured
in a CUDA graph. NOTE: merging in stage 1 instead (the last program of each (request, kv head)
to arrive, counted with an acq_rel atomic, merges; no stage-2 launch) was measured slower:
one Llama-3.1-8B layer at batch 1, 160-384 tokens, in a CUDA graph, 8.3-8.4 us against 5.4 us
with stage 2 (H100, 2026-11-26; the atomic's release is a MEMBAR.ALL.GPU in every program,
in the SASS of Triton 3.9 for sm_90).

An fp8 (E4M3) pool is widened in registers: the K scale is folded into ``sm_scale`` by the
launcher, the V scale multiplies each split's output (``v_scale``).

Shared prefixes (cascade): with ``starts``, stage 1 covers only tokens ``[start, seq_len)`` of
each request; ``prefix_decode_attention`` writes the partials of the shared ``[0, start)`` part
into further split slots, and stage 2 merges them all (``decode_merge`` with more splits).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import pdl
from .online_softmax import accumulate, attend_block, load_k, load_v, split_partial, weigh

_MIN_BLOCK_H = 16  # tl.dot needs at least 16 rows


@triton.jit
def _split_range(Req_idx, Seq_lens, Starts, Num_splits, min_per_split, cur_batch, split_id,
                 HAS_STARTS: tl.constexpr, SPLITS_IN_KERNEL: tl.constexpr,
                 MAX_SPLITS: tl.constexpr):
    """This program's request row, its length, and the tokens ``[start, end)`` of its split."""
    seq_len = tl.load(Seq_lens + cur_batch).to(tl.int32)
    req_row = tl.load(Req_idx + cur_batch).to(tl.int64)
    first = 0
    if HAS_STARTS:
        first = tl.load(Starts + cur_batch).to(tl.int32)
    if SPLITS_IN_KERNEL:  # num_kv_splits_for's count, from the length (no tensor ops before)
        num_splits = tl.minimum(tl.maximum(tl.cdiv(seq_len - first, min_per_split), 1),
                                MAX_SPLITS)
    else:
        num_splits = tl.load(Num_splits + cur_batch)
    per_split = tl.cdiv(seq_len - first, num_splits)
    start = first + per_split * split_id
    end = tl.minimum(start + per_split, seq_len)
    return req_row, seq_len, start, end


@triton.jit
def _load_kv(K_Buf, V_Buf, Req_to_token, req_row, stride_rt, offs_n, mask_n, cur_kv_head,
             stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, mask_d):
    """K (``[D, N]``) and V (``[N, D]``) of the tokens ``offs_n`` (``mask_n``) of one kv head."""
    slots = tl.load(Req_to_token + req_row * stride_rt + offs_n, mask=mask_n, other=0)
    k = load_k(K_Buf, slots, cur_kv_head, stride_kbs, stride_kh, offs_d, mask_n, mask_d)
    v = load_v(V_Buf, slots, cur_kv_head, stride_vbs, stride_vh, offs_d, mask_n, mask_d)
    return k, v


@triton.jit
def _attend(q, k, v, offs_n, end, mask_h, m_i, l_i, acc, sm_scale, PRECISION: tl.constexpr):
    """One block of keys folded into the running softmax (``m_i``, ``l_i``) and output, with k
    and v loaded already: ``attend_block``'s step without its loads."""
    m_new, alpha, p = weigh(q, k, mask_h, offs_n < end, m_i, sm_scale, PRECISION)
    l_i, acc = accumulate(q, p, v, alpha, l_i, acc, PRECISION)
    return m_new, l_i, acc


@triton.jit
def _decode_stage1(
    Q, K_Buf, V_Buf, Req_to_token, Req_idx, Seq_lens, Starts, Num_splits, Mid_o, Mid_lse,
    sm_scale, v_scale, min_per_split,
    stride_qb, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_rt,
    stride_mob, stride_moh, stride_mos, stride_lb, stride_lh,
    q_head_num,
    KV_GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, MAX_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr, HAS_STARTS: tl.constexpr, SPLITS_IN_KERNEL: tl.constexpr,
    PRE_KV: tl.constexpr, PDL: tl.constexpr,
):
    if not PRE_KV:
        pdl.enter(PDL)
    cur_batch = tl.program_id(0)
    cur_kv_head = tl.program_id(1)
    split_id = tl.program_id(2)
    offs_h = cur_kv_head * KV_GROUP + tl.arange(0, BLOCK_H)
    mask_h = (tl.arange(0, BLOCK_H) < KV_GROUP) & (offs_h < q_head_num)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    # the batch's lengths and rows are graph inputs, which no kernel of this step writes: read
    # before PDL's wait with PRE_KV, after it (the kernel's start) without
    req_row, seq_len, start, end = _split_range(
        Req_idx, Seq_lens, Starts, Num_splits, min_per_split, cur_batch, split_id,
        HAS_STARTS, SPLITS_IN_KERNEL, MAX_SPLITS)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    if PRE_KV:
        # Before PDL's wait (pdl.py), what no kernel of this step writes: the page table and
        # K/V of the tokens before the newest one (earlier steps'), for the split's first
        # block; the newest token (its slot, stored by the qkv product just before) and q after
        # the wait.
        offs_n = start + tl.arange(0, BLOCK_N)
        old = (offs_n < end) & (offs_n < seq_len - 1)
        k, v = _load_kv(K_Buf, V_Buf, Req_to_token, req_row, stride_rt, offs_n, old,
                        cur_kv_head, stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, mask_d)
        pdl.enter(PDL)
        newest = (offs_n < end) & (offs_n == seq_len - 1)
        k_new, v_new = _load_kv(K_Buf, V_Buf, Req_to_token, req_row, stride_rt, offs_n, newest,
                                cur_kv_head, stride_kbs, stride_kh, stride_vbs, stride_vh,
                                offs_d, mask_d)
        q = tl.load(Q + cur_batch * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_h[:, None] & mask_d[None, :], other=0.0)
        k = tl.where(newest[None, :], k_new, k)
        v = tl.where(newest[:, None], v_new, v)
        if start < end:  # the loop's first step, the same sums
            m_i, l_i, acc = _attend(q, k, v, offs_n, end, mask_h, m_i, l_i, acc, sm_scale,
                                    PRECISION)
        first_block = start + BLOCK_N
    else:
        q = tl.load(Q + cur_batch * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_h[:, None] & mask_d[None, :], other=0.0)
        first_block = start

    # NOTE: splits past num_splits (or empty ones) run zero iterations and write lse=-inf,
    # which stage 2 weighs by exp(-inf) = 0.
    for n0 in range(first_block, end, BLOCK_N):
        m_i, l_i, acc = attend_block(
            q, K_Buf, V_Buf, Req_to_token, req_row, stride_rt, cur_kv_head, stride_kbs,
            stride_kh, stride_vbs, stride_vh, n0 + tl.arange(0, BLOCK_N), end, mask_h, offs_d,
            mask_d, m_i, l_i, acc, sm_scale, PRECISION)

    out, lse = split_partial(m_i, l_i, acc, v_scale)
    tl.store(Mid_o + cur_batch * stride_mob + offs_h[:, None] * stride_moh + split_id * stride_mos
             + offs_d[None, :], out, mask=mask_h[:, None] & mask_d[None, :])
    tl.store(Mid_lse + cur_batch * stride_lb + offs_h * stride_lh + split_id, lse, mask=mask_h)


@triton.jit
def _decode_stage2(
    Mid_o, Mid_lse, O,
    stride_mob, stride_moh, stride_mos, stride_lb, stride_lh, stride_ob, stride_oh,
    BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, MAX_SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    pdl.enter(PDL)
    cur_batch = tl.program_id(0)
    cur_head = tl.program_id(1)
    offs_s = tl.arange(0, MAX_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    # NOTE: both loads issue together (one round trip, not two); a split of weight 0 may hold
    # anything (a cascade's unused prefix slots are never written), so it is dropped by a
    # select, not multiplied by its 0.
    lse = tl.load(Mid_lse + cur_batch * stride_lb + cur_head * stride_lh + offs_s)
    parts = tl.load(Mid_o + cur_batch * stride_mob + cur_head * stride_moh
                    + offs_s[:, None] * stride_mos + offs_d[None, :],
                    mask=mask_d[None, :], other=0.0)
    m = tl.max(lse, 0)
    w = tl.exp(lse - m)  # at least one split has work, so m is finite
    out = tl.sum(tl.where(w[:, None] > 0, parts * w[:, None], 0.0), 0) / tl.sum(w, 0)
    tl.store(O + cur_batch * stride_ob + cur_head * stride_oh + offs_d,
             out.to(O.dtype.element_ty), mask=mask_d)


def _pre_kv(num_kv_splits: torch.Tensor | None) -> bool:
    """Whether stage 1 reads the page table and the earlier tokens' K/V before PDL's wait
    (``SGDSL_ATTN_PRE``, default 1; 0: after it, as first built): only with the split count
    computed in the kernel (a ``num_kv_splits`` tensor is written by a kernel of the step).
    Measured (4x H200, Llama-3.1-8B TP=4 decode step, graph alone, same bits): 1720 -> 1686
    us."""
    return num_kv_splits is None and os.environ.get("SGDSL_ATTN_PRE", "1") not in ("", "0")


def num_kv_splits_for(seq_lens: torch.Tensor, max_kv_splits: int,
                      min_tokens_per_split: int = 256) -> torch.Tensor:
    """Per-request split count (int32, on seq_lens' device): long sequences get more splits.

    Pure tensor ops, so it can run inside a captured CUDA graph."""
    splits = torch.div(seq_lens + (min_tokens_per_split - 1), min_tokens_per_split,
                       rounding_mode="floor")
    return splits.clamp(1, max_kv_splits).to(torch.int32)


def _check(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, out: torch.Tensor,
           req_to_token: torch.Tensor, bs: int, max_kv_splits: int) -> None:
    assert q.dim() == 3 and k_buf.dim() == 3 and v_buf.shape == k_buf.shape, "bad q/kv rank"
    assert q.shape[0] >= bs and q.shape[2] == k_buf.shape[2], "q/kv head_dim mismatch"
    assert q.shape[1] % k_buf.shape[1] == 0, "num_heads must be a multiple of num_kv_heads"
    assert q.stride(2) == 1 and k_buf.stride(2) == 1 and v_buf.stride(2) == 1, "head_dim must be contiguous"
    assert out.shape[:3] == q.shape[:3] and out.stride(2) == 1
    assert req_to_token.stride(1) == 1, "req_to_token rows must be contiguous"
    assert max_kv_splits & (max_kv_splits - 1) == 0, "max_kv_splits must be a power of two"


def decode_attention_fwd(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, out: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    num_kv_splits: torch.Tensor | None, mid_o: torch.Tensor, mid_lse: torch.Tensor,
    sm_scale: float, max_kv_splits: int | None = None, k_scale: float = 1.0,
    v_scale: float = 1.0, block_n: int = 32, min_tokens_per_split: int = 1,
) -> torch.Tensor:
    """out[b, h] = softmax(q[b, h] . K[seq b]) V[seq b] over the request's whole paged sequence.

    q/out: [bs, H, D]; k_buf/v_buf: [slots, KVH, D]; mid_o: [bs, H, S, D] fp32 and
    mid_lse: [bs, H, S] fp32 scratch. ``max_kv_splits`` (a power of two <= S, default S) bounds
    num_kv_splits and sets the launch grid, so small values cost no empty programs.
    ``num_kv_splits`` None: ``num_kv_splits_for(seq_lens, max_kv_splits,
    min_tokens_per_split)``, computed in the kernel (no tensor ops before it)."""
    max_kv_splits = max_kv_splits or mid_lse.shape[2]
    decode_stage1(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, num_kv_splits,
                  mid_o, mid_lse, sm_scale, max_kv_splits, k_scale=k_scale, v_scale=v_scale,
                  block_n=block_n, min_tokens_per_split=min_tokens_per_split)
    return decode_merge(mid_o, mid_lse, out, max_kv_splits)


def decode_stage1(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    num_kv_splits: torch.Tensor | None, mid_o: torch.Tensor, mid_lse: torch.Tensor,
    sm_scale: float, max_kv_splits: int, starts: torch.Tensor | None = None,
    k_scale: float = 1.0, v_scale: float = 1.0, block_n: int = 32,
    min_tokens_per_split: int = 1,
) -> None:
    """Split partials into ``mid_o``/``mid_lse[..., :max_kv_splits]``; with ``starts`` ([bs]
    int64) only over tokens ``[starts[b], seq_lens[b])``. ``block_n``: keys per iteration.
    ``num_kv_splits`` None: each request's count from its length in the kernel, as
    ``num_kv_splits_for(length, max_kv_splits, min_tokens_per_split)``."""
    bs, num_heads, head_dim = q.shape
    kv_heads = k_buf.shape[1]
    _check(q, k_buf, v_buf, q, req_to_token, bs, max_kv_splits)
    assert max_kv_splits <= mid_lse.shape[2], "max_kv_splits exceeds the scratch"
    assert mid_o.shape == (bs, num_heads, mid_lse.shape[2], head_dim) and mid_o.stride(3) == 1
    assert mid_lse.shape[:2] == (bs, num_heads) and mid_lse.stride(2) == 1
    assert starts is None or starts.shape == (bs,), "starts: one per request"
    assert num_kv_splits is not None or min_tokens_per_split >= 1
    group = num_heads // kv_heads
    block_h = max(_MIN_BLOCK_H, triton.next_power_of_2(group))
    block_d = triton.next_power_of_2(head_dim)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    on = pdl.enabled(q)
    _decode_stage1[(bs, kv_heads, max_kv_splits)](
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens,
        starts if starts is not None else seq_lens,
        num_kv_splits if num_kv_splits is not None else seq_lens, mid_o, mid_lse,
        sm_scale * k_scale, v_scale, min_tokens_per_split,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0),
        v_buf.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        num_heads,
        KV_GROUP=group, BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_D=block_d, HEAD_DIM=head_dim,
        MAX_SPLITS=max_kv_splits, PRECISION=precision, HAS_STARTS=starts is not None,
        SPLITS_IN_KERNEL=num_kv_splits is None, PRE_KV=on and _pre_kv(num_kv_splits),
        num_warps=4, num_stages=2, **pdl.launch(on),
    )


def decode_merge(mid_o: torch.Tensor, mid_lse: torch.Tensor, out: torch.Tensor,
                 num_splits: int) -> torch.Tensor:
    """Stage 2: merge the first ``num_splits`` (a power of two) partials of every row."""
    bs, num_heads, _, head_dim = mid_o.shape
    assert num_splits & (num_splits - 1) == 0 and num_splits <= mid_lse.shape[2]
    assert out.shape == (bs, num_heads, head_dim) and out.stride(2) == 1
    _decode_stage2[(bs, num_heads)](
        mid_o, mid_lse, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_D=triton.next_power_of_2(head_dim), HEAD_DIM=head_dim, MAX_SPLITS=num_splits,
        num_warps=4, **pdl.launch(pdl.enabled(out)),
    )
    return out

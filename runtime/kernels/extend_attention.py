"""Extend (prefill) attention: new tokens attend to their request's cached prefix, read from
the paged token pool through ``req_to_token``, and causally to the new tokens themselves, read
from the contiguous k/v of this forward.

One program per (request, query head, block of BLOCK_M new tokens); the online softmax runs
first over the prefix (no mask but length), then over the new tokens up to the block's last row.
An fp8 pool's prefix is widened in registers and scaled (``k_scale``, ``v_scale``); the new
tokens come from this forward's k/v at full precision.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _extend_kernel(
    Q, K_new, V_new, O, K_Buf, V_Buf, Req_to_token, Req_idx, Prefix_lens, Extend_lens,
    Start_loc, Custom_mask, Mask_starts, sm_scale, k_scale, v_scale,
    stride_qt, stride_qh, stride_knt, stride_knh, stride_vnt, stride_vnh, stride_ot, stride_oh,
    stride_kbs, stride_kbh, stride_vbs, stride_vbh, stride_rt,
    KV_GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr,
    USE_MASK: tl.constexpr,
):
    cur_batch = tl.program_id(0)
    cur_head = tl.program_id(1)
    block_m = tl.program_id(2)
    kv_head = cur_head // KV_GROUP

    extend_len = tl.load(Extend_lens + cur_batch).to(tl.int32)
    if block_m * BLOCK_M >= extend_len:
        return
    prefix_len = tl.load(Prefix_lens + cur_batch).to(tl.int32)
    start = tl.load(Start_loc + cur_batch).to(tl.int64)
    req_row = tl.load(Req_idx + cur_batch).to(tl.int64)

    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < extend_len
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(Q + (start + offs_m[:, None]) * stride_qt + cur_head * stride_qh + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Stage 1: the cached prefix, gathered from the pool.
    for n0 in range(0, prefix_len, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < prefix_len
        slots = tl.load(Req_to_token + req_row * stride_rt + offs_n, mask=mask_n, other=0)
        k = tl.load(K_Buf + slots[None, :] * stride_kbs + kv_head * stride_kbh + offs_d[:, None],
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        v = tl.load(V_Buf + slots[:, None] * stride_vbs + kv_head * stride_vbh + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        qk = tl.dot(q, k.to(q.dtype), input_precision=PRECISION) * (sm_scale * k_scale)
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype),
                                            input_precision=PRECISION) * v_scale
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    # Stage 2: the new tokens, causal. Only keys up to this block's last query row matter.
    end_n = tl.minimum((block_m + 1) * BLOCK_M, extend_len)
    for n0 in range(0, end_n, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end_n
        k = tl.load(K_new + (start + offs_n[None, :]) * stride_knt + kv_head * stride_knh
                    + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        v = tl.load(V_new + (start + offs_n[:, None]) * stride_vnt + kv_head * stride_vnh
                    + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        qk = tl.dot(q, k.to(q.dtype), input_precision=PRECISION) * sm_scale
        causal = (offs_m[:, None] >= offs_n[None, :]) & mask_n[None, :]
        if USE_MASK:  # spec: a draft tree; its nodes see their ancestors only (parents first)
            mask_start = tl.load(Mask_starts + cur_batch)
            tree = tl.load(Custom_mask + mask_start + offs_m[:, None] * extend_len
                           + offs_n[None, :], mask=mask_m[:, None] & mask_n[None, :], other=0)
            causal = causal & (tree != 0)
        qk = tl.where(causal, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # NOTE: every valid query row sees at least key 0 of stage 2, so m_new is finite there;
        # padded rows (offs_m >= extend_len) are guarded so they never produce NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(qk - m_safe[:, None])
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + (start + offs_m[:, None]) * stride_ot + cur_head * stride_oh + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def extend_attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor, max_extend_len: int, sm_scale: float,
    k_scale: float = 1.0, v_scale: float = 1.0, custom_mask: torch.Tensor | None = None,
    mask_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens q [T, H, D] (ragged, request i at
    extend_start_loc[i]) over prefix (pool) + new k/v [T, KVH, D]. Writes and returns out.

    spec: ``custom_mask`` (bool, flat) further restricts the new tokens among themselves:
    request i's ``[n, n]`` row-major block starts at ``mask_starts[i]`` (a draft tree's
    ancestor mask: nodes in topological order, so it stays within the causal bound)."""
    assert q.dim() == 3 and k.dim() == 3 and v.shape == k.shape and out.shape == q.shape
    assert k_buf.dim() == 3 and v_buf.shape == k_buf.shape and k_buf.shape[1:] == k.shape[1:]
    assert q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2]
    assert q.shape[1] % k.shape[1] == 0, "num_heads must be a multiple of num_kv_heads"
    for t in (q, k, v, out, k_buf, v_buf, req_to_token):
        assert t.stride(-1) == 1, "last dimension must be contiguous"
    bs = int(req_pool_indices.shape[0])
    num_heads, head_dim = q.shape[1], q.shape[2]
    if bs == 0 or max_extend_len == 0:
        return out
    block_m = 64 if max_extend_len >= 64 and q.is_cuda else 16
    block_n = 64 if q.is_cuda else 16
    grid = (bs, num_heads, triton.cdiv(max_extend_len, block_m))
    use_mask = custom_mask is not None
    if use_mask:
        assert mask_starts is not None and mask_starts.shape[0] == bs
        custom_mask = custom_mask.view(torch.uint8) if custom_mask.dtype == torch.bool \
            else custom_mask
    _extend_kernel[grid](
        q, k, v, out, k_buf, v_buf, req_to_token, req_pool_indices, prefix_lens, extend_lens,
        extend_start_loc, custom_mask if use_mask else extend_lens,
        mask_starts if use_mask else extend_lens, sm_scale, k_scale, v_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0),
        v_buf.stride(1), req_to_token.stride(0),
        KV_GROUP=num_heads // k.shape[1], BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim), HEAD_DIM=head_dim,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_MASK=use_mask,
        num_warps=4, num_stages=2,
    )
    return out

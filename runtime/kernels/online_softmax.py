"""The online-softmax steps of the split-K decode kernels (``decode_attention``'s stage 1 and
``prefix_decode_attention``'s tiles): a block of paged keys folded into the running max, sums and
output of some query rows, and a split's partial (normalized output and log-sum-exp).

NOTE: ``triton.jit`` helpers are inlined where they are called, and each keeps the operations
of the loops they were taken from in the same order (K's load, the scores and weights, then V's
load and the products), so the kernels compile to the same code as with the loops written out.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_k(K_Buf, slots, kv_head, stride_kbs, stride_kh, offs_d, mask_n, mask_d):
    """K of the token slots ``slots`` (``mask_n``) of one kv head, as ``[D, N]``."""
    return tl.load(K_Buf + slots[None, :] * stride_kbs + kv_head * stride_kh + offs_d[:, None],
                   mask=mask_n[None, :] & mask_d[:, None], other=0.0)


@triton.jit
def load_v(V_Buf, slots, kv_head, stride_vbs, stride_vh, offs_d, mask_n, mask_d):
    """V of the token slots ``slots`` (``mask_n``) of one kv head, as ``[N, D]``."""
    return tl.load(V_Buf + slots[:, None] * stride_vbs + kv_head * stride_vh + offs_d[None, :],
                   mask=mask_n[:, None] & mask_d[None, :], other=0.0)


@triton.jit
def weigh(q, k, mask_rows, mask_n, m_i, sm_scale, PRECISION: tl.constexpr):
    """A key block's scores (masked: rows ``mask_rows`` x keys ``mask_n``) against the running
    max ``m_i``: the new max, the factor that rescales the old sums, the block's weights."""
    qk = tl.dot(q, k.to(q.dtype), input_precision=PRECISION) * sm_scale
    qk = tl.where(mask_rows[:, None] & mask_n[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # a row with no key yet (all -inf) keeps weight 0 instead of exp(nan)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(qk - m_safe[:, None])
    return m_new, alpha, p


@triton.jit
def accumulate(q, p, v, alpha, l_i, acc, PRECISION: tl.constexpr):
    """The running sums ``l_i`` and output ``acc`` rescaled by ``alpha``, plus the block's."""
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
    l_i = l_i * alpha + tl.sum(p, 1)
    return l_i, acc


@triton.jit
def attend_block(q, K_Buf, V_Buf, Req_to_token, row, stride_rt, kv_head, stride_kbs, stride_kh,
                 stride_vbs, stride_vh, offs_n, end, mask_rows, offs_d, mask_d, m_i, l_i, acc,
                 sm_scale, PRECISION: tl.constexpr):
    """The paged tokens ``offs_n`` (those below ``end``) of ``req_to_token`` row ``row`` folded
    into the running max, sums and output of the query rows ``q`` (``mask_rows``)."""
    mask_n = offs_n < end
    slots = tl.load(Req_to_token + row * stride_rt + offs_n, mask=mask_n, other=0)
    k = load_k(K_Buf, slots, kv_head, stride_kbs, stride_kh, offs_d, mask_n, mask_d)
    m_new, alpha, p = weigh(q, k, mask_rows, mask_n, m_i, sm_scale, PRECISION)
    v = load_v(V_Buf, slots, kv_head, stride_vbs, stride_vh, offs_d, mask_n, mask_d)
    l_i, acc = accumulate(q, p, v, alpha, l_i, acc, PRECISION)
    return m_new, l_i, acc


@triton.jit
def split_partial(m_i, l_i, acc, v_scale):
    """A split's output (normalized, times the fp8 pool's V scale) and log-sum-exp; a split
    that saw no key gets lse -inf, which the merge weighs by exp(-inf) = 0."""
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None] * v_scale
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    return out, lse

"""Qwen3's per-head q/k RMSNorm (Llama: none), the rotary embedding and (optionally) the
KV-cache store in one kernel.

These used to be three launches per layer (a per-head q/k RMSNorm kernel, then
``rotary.rotary_apply_gathered``, then ``kv_store.store_kv`` inside the attention backend),
each ~1.5 us at batch 1 for a few KB of data; one program per (token, head) now normalizes its
head, rotates it and, for a k head, writes it to the pool (v heads get programs that only
copy). Models without q/k norms (Llama, Mistral, Qwen2) use the same kernel with ``NORM``
off: rotary and KV store in one launch instead of two. Rounding is the separate kernels' (and
the torch path's): the normalized and the weighted values are each rounded to the activation
dtype, the rotation computes in fp32, and an fp8 pool stores the rounded k divided by its
scale, clamped to E4M3's range.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .kv_store import store_halves


@triton.jit
def _to_pool(Buf, Loc, tok, stride_bs, row, offs, mask, x1, x2, inv_scale, HALF: tl.constexpr,
             QUANT: tl.constexpr):
    """Store one head's halves (activation dtype) at ``Buf[Loc[tok], row]``."""
    slot = tl.load(Loc + tok).to(tl.int64)
    store_halves(Buf, slot, stride_bs, row, offs, x1, x2, mask, inv_scale, HALF, QUANT)


@triton.jit
def _head_rmsnorm(x1, x2, Wq, Wk, is_q, offs, mask, eps, HALF: tl.constexpr, dt: tl.constexpr):
    """One head's RMSNorm (q or k weight), each step rounded to the activation dtype ``dt``."""
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / (2 * HALF) + eps)
    w1 = tl.where(is_q, tl.load(Wq + offs, mask=mask, other=0.0),
                  tl.load(Wk + offs, mask=mask, other=0.0)).to(tl.float32)
    w2 = tl.where(is_q, tl.load(Wq + HALF + offs, mask=mask, other=0.0),
                  tl.load(Wk + HALF + offs, mask=mask, other=0.0)).to(tl.float32)
    y1 = (w1 * (x1 * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    y2 = (w2 * (x2 * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    return y1, y2


@triton.jit
def _qk_norm_rope_kernel(X, Out, Wq, Wk, Cos, Sin, K_Buf, V_Buf, Loc, stride_xt, stride_xh,
                         stride_ot, stride_oh, stride_ct, stride_st, stride_kbs, stride_vbs,
                         q_heads, kv_heads, eps, inv_k_scale, inv_v_scale,
                         HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, STORE: tl.constexpr,
                         QUANT: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)  # before the v heads' early return too
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    px = X + tok * stride_xt + head * stride_xh + offs
    if STORE:  # noqa: SIM102 (a compile-time test, kept apart from the runtime one)
        if head >= q_heads + kv_heads:  # a v head: into the pool as it is
            _to_pool(V_Buf, Loc, tok, stride_vbs, head - q_heads - kv_heads, offs, mask,
                     tl.load(px, mask=mask, other=0.0), tl.load(px + HALF, mask=mask, other=0.0),
                     inv_v_scale, HALF, QUANT)
            return
    y1 = tl.load(px, mask=mask, other=0.0).to(tl.float32)
    y2 = tl.load(px + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        y1, y2 = _head_rmsnorm(y1, y2, Wq, Wk, head < q_heads, offs, mask, eps, HALF,
                               X.dtype.element_ty)
    cos = tl.load(Cos + tok * stride_ct + offs, mask=mask, other=1.0).to(tl.float32)
    sin = tl.load(Sin + tok * stride_st + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    o1 = (y1 * cos - y2 * sin).to(Out.dtype.element_ty)
    o2 = (y2 * cos + y1 * sin).to(Out.dtype.element_ty)
    po = Out + tok * stride_ot + head * stride_oh + offs
    tl.store(po, o1, mask=mask)
    tl.store(po + HALF, o2, mask=mask)
    if STORE:  # noqa: SIM102
        if head >= q_heads:  # a k head: also into the pool
            _to_pool(K_Buf, Loc, tok, stride_kbs, head - q_heads, offs, mask, o1, o2,
                     inv_k_scale, HALF, QUANT)


def qk_norm_rope(qkv: torch.Tensor, q_weight: torch.Tensor | None,
                 k_weight: torch.Tensor | None, q_heads: int, eps: float, cos: torch.Tensor,
                 sin: torch.Tensor, store=None) -> torch.Tensor:
    """``qkv [T, q_heads + 2 * kv_heads, D]`` (rows may be strided: a view of the qkv
    projection's output) -> new contiguous ``[T, q_heads + kv_heads, D]``: each q/k head
    RMS-normalized (``q_weight`` below ``q_heads``, else ``k_weight``; both None: no norm),
    then rotated (neox layout) by ``cos``/``sin`` ``[T, 1, D]`` as ``RotaryEmbedding.lookup``
    returns them (sin's first half, stored negated, is not read). ``store`` (a
    ``KVStoreTarget``): the rotated k and the v heads are also written to its buffers at its
    slots."""
    tokens, heads, head_dim = qkv.shape
    kv_heads = (heads - q_heads) // 2
    assert heads == q_heads + 2 * kv_heads and qkv.stride(2) == 1 and head_dim % 2 == 0
    norm = q_weight is not None
    if norm:
        assert k_weight is not None and q_weight.shape == k_weight.shape == (head_dim,)
        assert q_weight.is_contiguous() and k_weight.is_contiguous()
    else:
        assert k_weight is None, "q and k norms come together"
        q_weight = k_weight = qkv  # placeholders: never read
    cos2, sin2 = cos.reshape(tokens, -1), sin.reshape(tokens, -1)
    assert cos2.shape == sin2.shape == (tokens, head_dim), "rotary over the whole head"
    assert cos2.stride(1) == 1 and sin2.stride(1) == 1
    out = torch.empty((tokens, q_heads + kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if store is not None:
        k_buf, v_buf, loc = store.k_buf, store.v_buf, store.loc
        assert k_buf.shape[1:] == v_buf.shape[1:] == (kv_heads, head_dim)
        assert k_buf.stride(1) == v_buf.stride(1) == head_dim and loc.shape == (tokens,)
        assert k_buf.stride(2) == v_buf.stride(2) == 1 and k_buf.dtype == v_buf.dtype
        scales = 1.0 / store.k_scale, 1.0 / store.v_scale
    else:
        k_buf = v_buf = loc = out  # placeholders: never read
        scales = 1.0, 1.0
    if tokens:
        half = head_dim // 2
        grid = (tokens, q_heads + kv_heads + (kv_heads if store is not None else 0))
        _qk_norm_rope_kernel[grid](
            qkv, out, q_weight, k_weight, cos2, sin2, k_buf, v_buf, loc, qkv.stride(0),
            qkv.stride(1), out.stride(0), out.stride(1), cos2.stride(0), sin2.stride(0),
            k_buf.stride(0), v_buf.stride(0), q_heads, kv_heads, eps, *scales, HALF=half,
            BLOCK_HALF=triton.next_power_of_2(half), STORE=store is not None,
            QUANT=k_buf.dtype == torch.float8_e4m3fn, NORM=norm, num_warps=1,
            **pdl.launch(pdl.enabled(qkv)))
    return out

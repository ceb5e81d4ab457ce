"""Rotary position embedding (neox / rotate-half layout, used by Llama, Qwen2, Qwen3), applied
in place to q [T, H, D] and k [T, KVH, D] from a cos/sin cache indexed by absolute position.

``cos_sin_cache`` is [max_pos, rotary_dim] fp32: cos in the first half, sin in the second.
Dimensions past rotary_dim (partial rotary) are left untouched.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate(X, base, stride_h, n_heads, cos, sin, HALF: tl.constexpr,
            BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < n_heads) & (offs_d[None, :] < HALF)
    p1 = X + base + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(p1, o1.to(X.dtype.element_ty), mask=mask)
    tl.store(p1 + HALF, o2.to(X.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(Q, K, Pos, Cache, stride_qt, stride_qh, stride_kt, stride_kh, stride_c,
                   n_q_heads, n_k_heads, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                   BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + tok).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    cos = tl.load(Cache + pos * stride_c + offs_d, mask=offs_d < HALF, other=1.0)
    sin = tl.load(Cache + pos * stride_c + HALF + offs_d, mask=offs_d < HALF, other=0.0)
    _rotate(Q, tok * stride_qt, stride_qh, n_q_heads, cos, sin, HALF, BLOCK_QH, BLOCK_HALF)
    _rotate(K, tok * stride_kt, stride_kh, n_k_heads, cos, sin, HALF, BLOCK_KH, BLOCK_HALF)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in place by their positions; returns (q, k)."""
    assert q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] == positions.shape[0]
    assert q.shape[2] == k.shape[2] and q.stride(2) == 1 and k.stride(2) == 1
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.stride(1) == 1
    rot = cos_sin_cache.shape[1]
    assert rot % 2 == 0 and rot <= q.shape[2], "rotary_dim must be even and <= head_dim"
    if q.shape[0] == 0:
        return q, k
    half = rot // 2
    _rotary_kernel[(q.shape[0],)](
        q, k, positions, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos_sin_cache.stride(0), q.shape[1], k.shape[1],
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_QH=triton.next_power_of_2(q.shape[1]), BLOCK_KH=triton.next_power_of_2(k.shape[1]),
        num_warps=4)
    return q, k


@triton.jit
def _rotary_gathered_kernel(X, Cos, Sin, Out, stride_xt, stride_xh, stride_ct, stride_st,
                            stride_ot, stride_oh, n_heads, HALF: tl.constexpr,
                            BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    mask = (offs_h[:, None] < n_heads) & mask_d[None, :]
    cos = tl.load(Cos + tok * stride_ct + offs_d, mask=mask_d, other=1.0).to(tl.float32)
    sin = tl.load(Sin + tok * stride_st + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    px = X + tok * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(px, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(px + HALF, mask=mask, other=0.0).to(tl.float32)
    po = Out + tok * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    tl.store(po, (x1 * cos[None, :] - x2 * sin[None, :]).to(Out.dtype.element_ty), mask=mask)
    tl.store(po + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(Out.dtype.element_ty),
             mask=mask)


def rotary_apply_gathered(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Out-of-place rotate-half rotary of x [T, H, D] (rows may be strided) with per-token
    cos/sin [T, 1, D] or [T, D] as RotaryEmbedding.lookup returns them: cos has equal halves,
    sin's second half is +sin (its first half may be stored negated; it is not read).
    Returns a new contiguous [T, H, D] tensor."""
    assert x.dim() == 3 and x.stride(2) == 1
    t, h, d = x.shape
    cos2, sin2 = cos.reshape(t, -1), sin.reshape(t, -1)
    assert cos2.shape == (t, d) and sin2.shape == (t, d) and d % 2 == 0
    assert cos2.stride(1) == 1 and sin2.stride(1) == 1
    sin2 = sin2[:, d // 2:]  # the +sin half
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    _rotary_gathered_kernel[(t,)](
        x, cos2, sin2, out, x.stride(0), x.stride(1), cos2.stride(0), sin2.stride(0),
        out.stride(0), out.stride(1), h, HALF=d // 2, BLOCK_H=triton.next_power_of_2(h),
        BLOCK_HALF=triton.next_power_of_2(d // 2), num_warps=4)
    return out


def build_cos_sin_cache(rotary_dim: int, max_pos: int, base: float,
                        device: torch.device | str = "cpu",
                        inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """[max_pos, rotary_dim] fp32 cache (cos | sin). Pass inv_freq for scaled ropes (llama3)."""
    if inv_freq is None:
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    t = torch.arange(max_pos, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float().cpu())
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)

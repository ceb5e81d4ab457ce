"""KV store: write the new tokens' k and v into the token pool at their slots, one launch
for both buffers (instead of two index_put kernels per layer). An fp8 (E4M3) pool stores
``value / scale`` clamped to the format's range (it has no inf; an overflow would be NaN).
``store_halves``: the same store of one head given as its two rotary halves, for the kernels
that write k and v to the pool in their epilogue (gemv_pairs, qk_norm_rope)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl


@triton.jit
def _kv_store_kernel(K, V, K_Buf, V_Buf, Loc, stride_kt, stride_vt, stride_kbs, stride_vbs,
                     row_elems, inv_k_scale, inv_v_scale, BLOCK: tl.constexpr,
                     QUANT: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row_elems
    slot = tl.load(Loc + tok).to(tl.int64)
    k = tl.load(K + tok * stride_kt + offs, mask=mask)
    v = tl.load(V + tok * stride_vt + offs, mask=mask)
    if QUANT:
        k = tl.clamp(k.to(tl.float32) * inv_k_scale, -448.0, 448.0)
        v = tl.clamp(v.to(tl.float32) * inv_v_scale, -448.0, 448.0)
    tl.store(K_Buf + slot * stride_kbs + offs, k.to(K_Buf.dtype.element_ty), mask=mask)
    tl.store(V_Buf + slot * stride_vbs + offs, v.to(V_Buf.dtype.element_ty), mask=mask)


@triton.jit
def store_halves(Buf, slot, stride_bs, head, offs, x1, x2, mask, inv_scale, HALF: tl.constexpr,
                 QUANT: tl.constexpr):
    """One kv head's halves (``offs`` of each) at ``Buf[slot, head]``; fp8 (``QUANT``): divided
    by the scale (times ``inv_scale``) and clamped."""
    p = Buf + slot * stride_bs + head * (2 * HALF) + offs
    if QUANT:
        x1 = tl.clamp(x1.to(tl.float32) * inv_scale, -448.0, 448.0)
        x2 = tl.clamp(x2.to(tl.float32) * inv_scale, -448.0, 448.0)
    tl.store(p, x1.to(Buf.dtype.element_ty), mask=mask)
    tl.store(p + HALF, x2.to(Buf.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
             loc: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k_buf[loc[t]] = k[t]; v_buf[loc[t]] = v[t] for k/v [T, KVH, D], buffers [slots, KVH, D]
    (fp8 buffers: divided by the scales)."""
    assert k.dim() == 3 and v.shape == k.shape and k_buf.shape[1:] == k.shape[1:]
    assert v_buf.shape == k_buf.shape and loc.shape == (k.shape[0],)
    # One token's heads must be one contiguous run in every tensor.
    for t in (k, v, k_buf, v_buf):
        assert t.stride(2) == 1 and t.stride(1) == t.shape[2], "[KVH, D] must be contiguous"
    if k.shape[0] == 0:
        return
    row = k.shape[1] * k.shape[2]
    block = min(triton.next_power_of_2(row), 1024)
    _kv_store_kernel[(k.shape[0], triton.cdiv(row, block))](
        k, v, k_buf, v_buf, loc, k.stride(0), v.stride(0), k_buf.stride(0), v_buf.stride(0),
        row, 1.0 / k_scale, 1.0 / v_scale, BLOCK=block,
        QUANT=k_buf.dtype == torch.float8_e4m3fn, num_warps=4,
        **pdl.launch(pdl.enabled(k)))

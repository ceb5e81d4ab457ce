"""KV store: write the new tokens' k and v into the token pool at their slots, one launch
for both buffers (instead of two index_put kernels per layer)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_store_kernel(K, V, K_Buf, V_Buf, Loc, stride_kt, stride_vt, stride_kbs, stride_vbs,
                     row_elems, BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row_elems
    slot = tl.load(Loc + tok).to(tl.int64)
    k = tl.load(K + tok * stride_kt + offs, mask=mask)
    v = tl.load(V + tok * stride_vt + offs, mask=mask)
    tl.store(K_Buf + slot * stride_kbs + offs, k.to(K_Buf.dtype.element_ty), mask=mask)
    tl.store(V_Buf + slot * stride_vbs + offs, v.to(V_Buf.dtype.element_ty), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
             loc: torch.Tensor) -> None:
    """k_buf[loc[t]] = k[t]; v_buf[loc[t]] = v[t] for k/v [T, KVH, D], buffers [slots, KVH, D]."""
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
        row, BLOCK=block, num_warps=4)

"""SiLU-and-mul, the gate of a SwiGLU MLP: ``silu(x[:, :I]) * x[:, I:]`` in one pass."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl


@triton.jit
def _silu_and_mul_kernel(X, Out, stride_x, stride_o, inter, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(X + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + inter + offs, mask=mask, other=0.0)
    # HF rounds silu(gate) to the activation dtype before the product; so do we.
    act = (gate / (1.0 + tl.exp(-gate))).to(X.dtype.element_ty)
    tl.store(Out + row * stride_o + offs,
             (act.to(tl.float32) * up.to(tl.float32)).to(Out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, 2*I] -> [rows, I]."""
    assert x.dim() == 2 and x.shape[1] % 2 == 0 and x.stride(1) == 1
    inter = x.shape[1] // 2
    out = torch.empty((x.shape[0], inter), dtype=x.dtype, device=x.device) if out is None else out
    assert out.shape == (x.shape[0], inter) and out.stride(1) == 1
    if x.shape[0] == 0:
        return out
    block = min(triton.next_power_of_2(inter), 1024)
    _silu_and_mul_kernel[(x.shape[0], triton.cdiv(inter, block))](
        x, out, x.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4,
        **pdl.launch(pdl.enabled(x)))
    return out

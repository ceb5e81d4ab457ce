"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer.

Matches HF Llama: the sum ``x + residual`` is rounded to the activation dtype (it becomes the
next residual), the norm is computed in fp32, and the weight multiplies the normalized value
after it is rounded back to the activation dtype.

With a residual, ``x`` may also be ``[rows, parts, hidden]``: the parts are summed first (fp32,
rounded to the dtype), as a MoE layer's k weighted expert rows are (``fused_moe``'s combine):
the combine then costs no launch of its own.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl


@triton.jit
def _rmsnorm_kernel(X, Residual, ResOut, Out, W, stride_x, stride_xp, stride_r, stride_ro,
                    stride_o, n_cols, eps, HAS_RESIDUAL: tl.constexpr, PARTS: tl.constexpr,
                    BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    if PARTS == 1:
        x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    else:  # the combine of fused_moe: the same fp32 sum, rounded once
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(PARTS):
            acc += tl.load(X + row * stride_x + j * stride_xp + offs, mask=mask,
                           other=0.0).to(tl.float32)
        x = acc.to(X.dtype.element_ty)
    if HAS_RESIDUAL:
        r = tl.load(Residual + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(ResOut + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / n_cols
    normed = (xf * (1.0 / tl.sqrt(var + eps))).to(X.dtype.element_ty)
    w = tl.load(W + offs, mask=mask, other=0.0)
    tl.store(Out + row * stride_o + offs, (w.to(tl.float32) * normed.to(tl.float32))
             .to(Out.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
            out: torch.Tensor, res_out: torch.Tensor | None = None) -> None:
    parts = x.shape[1] if x.dim() == 3 else 1
    assert x.dim() == 2 or (x.dim() == 3 and residual is not None), "parts need a residual"
    assert x.stride(-1) == 1, "x must be [rows, (parts,) hidden] with contiguous rows"
    rows, hidden = x.shape[0], x.shape[-1]
    assert weight.shape == (hidden,) and weight.is_contiguous()
    assert out.shape == (rows, hidden) and out.stride(1) == 1
    if residual is not None:
        assert residual.shape == (rows, hidden) and residual.stride(1) == 1
        assert residual.dtype == x.dtype
        res_out = residual if res_out is None else res_out
        assert res_out.shape == (rows, hidden) and res_out.stride(1) == 1
    if rows == 0:
        return
    block = triton.next_power_of_2(hidden)
    _rmsnorm_kernel[(rows,)](
        x, residual if residual is not None else x, res_out if residual is not None else x,
        out, weight, x.stride(0), x.stride(1) if parts > 1 else 0,
        residual.stride(0) if residual is not None else 0,
        res_out.stride(0) if residual is not None else 0, out.stride(0),
        hidden, eps, HAS_RESIDUAL=residual is not None, PARTS=parts, BLOCK=block,
        num_warps=min(max(block // 256, 1), 16), **pdl.launch(pdl.enabled(x)),
    )


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """weight * x / rms(x) over the last dimension of x [rows, hidden]."""
    out = torch.empty_like(x) if out is None else out
    _launch(x, None, weight, eps, out)
    return out


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float, inplace: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """s = x + residual; returns (rmsnorm(s), s). ``inplace``: s is written into residual;
    otherwise into a new tensor (residual is left as it was). ``x`` ``[rows, parts, hidden]``:
    s = x.sum(1) + residual (see the module docstring)."""
    out = torch.empty_like(residual)
    res_out = residual if inplace else torch.empty_like(residual)
    _launch(x, residual, weight, eps, out, res_out)
    return out, res_out

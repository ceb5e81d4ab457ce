"""RMSNorm (plain, fused residual add, half precision) and SiLU-and-mul against formulas."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sgdsl.runtime.layers.activation import SiluAndMul
from sgdsl.runtime.layers.norm import RMSNorm


def reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.double()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.double())


def test_rmsnorm_plain_and_fused():
    norm = RMSNorm(16, eps=1e-5)
    norm.weight.data.copy_(torch.randn(16))
    x, res = torch.randn(5, 16), torch.randn(5, 16)
    torch.testing.assert_close(norm(x).double(), reference(x, norm.weight, 1e-5), rtol=1e-5,
                               atol=1e-6)
    out, new_res = norm(x, res)
    torch.testing.assert_close(new_res, x + res)
    torch.testing.assert_close(out.double(), reference(x + res, norm.weight, 1e-5), rtol=1e-5,
                               atol=1e-6)


def test_rmsnorm_sums_expert_rows_before_the_add():
    """x one dim more than the residual (a MoE block's [tokens, top_k, hidden] weighted rows):
    the rows are summed (fp32, rounded once), then added and normalized."""
    norm = RMSNorm(16, eps=1e-5, dtype=torch.bfloat16)
    norm.weight.data.copy_(torch.randn(16))
    rows, res = torch.randn(5, 3, 16).bfloat16(), torch.randn(5, 16).bfloat16()
    out, new_res = norm(rows, res)
    summed = rows.float().sum(1).bfloat16()
    assert out.shape == new_res.shape == (5, 16)
    assert torch.equal(new_res, summed + res)
    assert torch.equal(out, norm(summed, res)[0])


def test_rmsnorm_bf16_computes_in_fp32():
    norm = RMSNorm(64, eps=1e-6, dtype=torch.bfloat16)
    x = (torch.randn(3, 64) * 100).bfloat16()  # squares overflow bf16 precision if not upcast
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference(x.float(), norm.weight.float(), 1e-6),
                               rtol=2e-2, atol=2e-2)


def test_silu_and_mul():
    x = torch.randn(4, 10)
    torch.testing.assert_close(SiluAndMul()(x), F.silu(x[:, :5]) * x[:, 5:])

"""The batch-1 matrix-vector kernel (gemv.py) vs a float64 product: plain weights under Triton's
interpreter on CPU (several tiles, shapes that are not multiples of the tiles), fp8
weights with per-channel scales on the GPU."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.gemv import gemv
from sgdsl.runtime.layers.quantization.fp8_utils import dequantize, quantize_rows

from .conftest import ON_GPU, rel_err, tol


TILES = [None, (2, 256, 1), (4, 512, 2), (8, 1024, 4), (1, 2048, 1)]


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("n,k", [(70, 300), (64, 1024), (5, 2048)])
def test_gemv_plain_weight(device, dtype, tile, n, k):
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=gen).to(dtype).to(device)
    w = torch.randn(n, k, generator=gen).to(dtype).to(device)
    out = gemv(x, w, None, tile)
    assert out.shape == (1, n) and out.dtype == dtype
    assert rel_err(out, x.double() @ w.double().T) < tol(dtype)


def test_gemv_rejects_more_rows(device, dtype):
    with pytest.raises(AssertionError, match="one row"):
        gemv(torch.zeros(2, 64, dtype=dtype, device=device),
             torch.zeros(8, 64, dtype=dtype, device=device))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="fp8 weights need CUDA")
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("n,k", [(384, 640), (4096, 14336), (6144, 4096)])
def test_gemv_fp8_per_channel(tile, n, k):
    gen = torch.Generator().manual_seed(n)
    w = torch.randn(n, k, generator=gen) * 0.05
    q, s = quantize_rows(w)
    x = torch.randn(1, k, generator=gen).bfloat16().cuda()
    out = gemv(x, q.cuda(), s.cuda(), tile)
    ref = x.double().cpu() @ dequantize(q, s).double().T
    assert out.dtype == torch.bfloat16 and rel_err(out.cpu(), ref) < 1e-2


def _rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("tile", [None, (2, 256, 1), (4, 512, 2)])
@pytest.mark.parametrize("n,k", [(70, 300), (64, 1024)])
def test_gemv_fused_norm_bias_residual(device, dtype, tile, n, k):
    """``norm=``, ``bias=``, ``residual=``: linear(RMSNorm(x)) + bias + residual in one launch,
    each part alone and all together (the norm scaled away from 1: it must be applied)."""
    gen = torch.Generator().manual_seed(n * k)
    make = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(dtype).to(device)
    x, w = make(1, k, scale=3.0), make(n, k)
    nw, bias, res = make(k, scale=0.5) + 1, make(n), make(1, n)
    normed = _rmsnorm_ref(x, nw, 1e-5)
    cases = {"norm": ({"norm": (nw, 1e-5)}, normed @ w.double().T),
             "bias": ({"bias": bias}, x.double() @ w.double().T + bias.double()),
             "residual": ({"residual": res}, x.double() @ w.double().T + res.double()),
             "all": ({"norm": (nw, 1e-5), "bias": bias, "residual": res},
                     normed @ w.double().T + bias.double() + res.double())}
    for name, (kw, ref) in cases.items():
        out = gemv(x, w, None, tile, **kw)
        assert out.shape == (1, n) and out.dtype == dtype
        assert rel_err(out, ref) < tol(dtype), name

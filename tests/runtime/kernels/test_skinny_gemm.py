"""The skinny GEMM behind the decode linear layers (plain weights, with and without split-K,
decode and prefill row counts) vs a float64 product; runs under Triton's interpreter on CPU."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.fp8_matmul import w8a16_matmul

from .conftest import rel_err, tol


@pytest.mark.parametrize("m,split_k", [(1, 1), (3, 2), (16, 4), (40, 1)])
def test_skinny_gemm_plain_weight(device, dtype, m, split_k):
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 300, generator=gen).to(dtype).to(device)
    w = torch.randn(70, 300, generator=gen).to(dtype).to(device)
    out = w8a16_matmul(x, w, None, split_k=split_k)
    assert out.shape == (m, 70) and out.dtype == dtype
    assert rel_err(out, x.double() @ w.double().T) < tol(dtype)

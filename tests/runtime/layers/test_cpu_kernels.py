"""C decode kernels (layers/cpu_kernels.py) against torch references, including inputs in the
split-matmul layout ``[splits, n, cols / splits]`` and the fallback switch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgdsl.runtime.layers import cpu_kernels
from sgdsl.runtime.layers.linear import cpu_layout, split_matmul, split_matvec

kernels = cpu_kernels.load()  # CI machines have gcc; None here would fail every test


def test_kernels_built():
    assert kernels is not None and kernels.path.is_file()


def split_product(n: int, cols: int, splits: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A real split-matmul output (raw ``[splits, n, blk]`` buffer) and its row-major value."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=gen)
    w = cpu_layout(torch.randn(cols, 16, generator=gen), splits)
    raw = torch.bmm(x.expand(w.shape[0], n, 16), w).contiguous()
    return raw, split_matmul(x, w)


@pytest.mark.parametrize("n,splits", [(1, 1), (1, 2), (3, 2), (2, 3)])
def test_add_rmsnorm_matches_torch(n, splits):
    d = 48
    raw, x = split_product(n, d, splits, seed=n * 10 + splits)
    res = torch.randn(n, d)
    w = torch.rand(d) + 0.5
    expect_res = res + x
    expect = F.rms_norm(expect_res, (d,), w, 1e-5)
    out, tmp = torch.empty(n, d), torch.empty(d)
    kernels.add_rmsnorm(raw.data_ptr(), raw.shape[0], res.data_ptr(), w.data_ptr(), out.data_ptr(),
                        n, d, 1e-5, tmp.data_ptr())
    assert torch.equal(res, expect_res)  # the residual is updated in place, exactly
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)


def test_rmsnorm_without_add_keeps_residual():
    res, w = torch.randn(2, 32), torch.rand(32)
    before = res.clone()
    out, tmp = torch.empty(2, 32), torch.empty(32)
    kernels.add_rmsnorm(None, 1, res.data_ptr(), w.data_ptr(), out.data_ptr(), 2, 32, 1e-6,
                        tmp.data_ptr())
    assert torch.equal(res, before)
    torch.testing.assert_close(out, F.rms_norm(before, (32,), w, 1e-6), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n,splits", [(1, 2), (4, 2), (2, 1)])
def test_silu_mul_matches_torch(n, splits):
    d = 40
    raw, gu = split_product(n, 2 * d, splits, seed=7 + n)
    gu_scaled = raw * 8  # wide range of gate values, incl. deep negatives (exp clamping)
    expect = F.silu(gu[:, :d] * 8) * (gu[:, d:] * 8)
    out, tmp = torch.empty(n, d), torch.empty(2 * d)
    kernels.silu_mul(gu_scaled.data_ptr(), splits, out.data_ptr(), n, d, tmp.data_ptr())
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)


def test_silu_extremes():
    g = torch.tensor([[-200.0, -90.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 90.0, 200.0]])
    gu = torch.cat([g, torch.ones_like(g)], dim=1)
    out, tmp = torch.empty_like(g), torch.empty(gu.shape[1])
    kernels.silu_mul(gu.data_ptr(), 1, out.data_ptr(), 1, g.shape[1], tmp.data_ptr())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.silu(g), rtol=1e-6, atol=1e-30)


def test_disable_switch(monkeypatch):
    monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "1")
    cpu_kernels.load.cache_clear()
    try:
        assert cpu_kernels.load() is None
    finally:
        monkeypatch.delenv(cpu_kernels.DISABLE_ENV)
        cpu_kernels.load.cache_clear()
    assert cpu_kernels.load() is not None


@pytest.mark.parametrize("out_features,in_features", [(96, 64), (96, 66), (30, 7), (9000, 24),
                                                      (8194, 13)])
@pytest.mark.parametrize("splits,rows", [(1, 1), (2, 1), (2, 3), (1, 8)])
def test_matvec_matches_matmul(out_features, in_features, splits, rows):
    """Narrow blocks (read as 4 row bands, incl. a row tail when ``in`` is not a multiple of 4)
    and wide blocks (> 4096 columns: adjacent rows), one or several x rows, against ``x @ W.T``."""
    gen = torch.Generator().manual_seed(out_features + in_features + splits + rows)
    w = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    weight = cpu_layout(w, splits)
    expect = x @ w.t()
    torch.testing.assert_close(split_matvec(x, weight, kernels), expect, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(split_matmul(x, weight), expect, rtol=1e-5, atol=1e-4)
    if rows > 1:  # each row is summed exactly as it would be alone (batch-invariant)
        assert torch.equal(split_matvec(x[1:2], weight, kernels)[0],
                           split_matvec(x, weight, kernels)[1])

"""Fused add+RMSNorm, rotary, SiLU-and-mul and KV store vs torch references."""
from __future__ import annotations

import torch

from sgdsl.runtime.kernels.activation import silu_and_mul
from sgdsl.runtime.kernels.kv_store import store_kv
from sgdsl.runtime.kernels.rmsnorm import fused_add_rmsnorm, rmsnorm
from sgdsl.runtime.kernels.rotary import build_cos_sin_cache, rotary_embedding

from .conftest import rel_err, tol


def _rand(*shape, gen, dtype, device):
    return torch.randn(*shape, generator=gen).to(dtype).to(device)


def _ref_rmsnorm(x, w, eps):
    xf = x.double()
    return w.double() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def test_rmsnorm_and_fused_add(device, dtype):
    gen = torch.Generator().manual_seed(0)
    x, r = (_rand(5, 100, gen=gen, dtype=dtype, device=device) for _ in range(2))
    w = _rand(100, gen=gen, dtype=dtype, device=device)
    assert rel_err(rmsnorm(x, w, 1e-6), _ref_rmsnorm(x, w, 1e-6)) < tol(dtype)
    r0 = r.clone()
    out, res = fused_add_rmsnorm(x, r, w, 1e-5)
    assert res.data_ptr() == r.data_ptr(), "residual is updated in place"
    assert rel_err(res, x.double() + r0.double()) < tol(dtype)
    assert rel_err(out, _ref_rmsnorm(x.double() + r0.double(), w, 1e-5)) < tol(dtype)


def test_silu_and_mul(device, dtype):
    gen = torch.Generator().manual_seed(1)
    x = _rand(3, 2 * 1100, gen=gen, dtype=dtype, device=device)  # two column blocks
    g, u = x.double().chunk(2, dim=-1)
    assert rel_err(silu_and_mul(x), torch.nn.functional.silu(g) * u) < tol(dtype)


def _ref_rotate(x, cos, sin):
    half = cos.shape[-1]
    x1, x2 = x[..., :half].double(), x[..., half:2 * half].double()
    rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([rot, x[..., 2 * half:].double()], dim=-1)


def test_rotary_full_and_partial(device, dtype):
    gen = torch.Generator().manual_seed(2)
    for head_dim, rot in ((48, 48), (40, 24)):
        q = _rand(7, 5, head_dim, gen=gen, dtype=dtype, device=device)
        k = _rand(7, 3, head_dim, gen=gen, dtype=dtype, device=device)
        pos = torch.tensor([0, 3, 9, 1, 50, 2, 63], device=device)
        cache = build_cos_sin_cache(rot, 64, 10000.0, device)
        cos = cache[pos, : rot // 2].double()[:, None, :]
        sin = cache[pos, rot // 2:].double()[:, None, :]
        ref_q, ref_k = _ref_rotate(q, cos, sin), _ref_rotate(k, cos, sin)
        rotary_embedding(pos, q, k, cache)
        assert rel_err(q, ref_q) < tol(dtype) and rel_err(k, ref_k) < tol(dtype)


def test_store_kv_scattered(device, dtype):
    gen = torch.Generator().manual_seed(3)
    k, v = (_rand(6, 3, 20, gen=gen, dtype=dtype, device=device) for _ in range(2))
    k_buf = torch.zeros(16, 3, 20, dtype=dtype, device=device)
    v_buf = torch.zeros_like(k_buf)
    loc = torch.tensor([9, 2, 15, 4, 1, 11], device=device)
    store_kv(k, v, k_buf, v_buf, loc)
    assert torch.equal(k_buf[loc], k) and torch.equal(v_buf[loc], v)
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[loc.cpu()] = False
    assert not k_buf[untouched.to(device)].any() and not v_buf[untouched.to(device)].any()


def test_fused_add_rmsnorm_out_of_place(device, dtype):
    gen = torch.Generator().manual_seed(4)
    x, r = (_rand(4, 64, gen=gen, dtype=dtype, device=device) for _ in range(2))
    w = _rand(64, gen=gen, dtype=dtype, device=device)
    r0 = r.clone()
    out, res = fused_add_rmsnorm(x, r, w, 1e-6, inplace=False)
    assert torch.equal(r, r0) and res.data_ptr() != r.data_ptr()
    assert rel_err(res, x.double() + r0.double()) < tol(dtype)
    assert rel_err(out, _ref_rmsnorm(x.double() + r0.double(), w, 1e-6)) < tol(dtype)


def test_rotary_gathered_strided_rows(device, dtype):
    from sgdsl.runtime.kernels.rotary import rotary_apply_gathered

    gen = torch.Generator().manual_seed(5)
    packed = _rand(5, 7 * 32 + 10, gen=gen, dtype=dtype, device=device)  # qk + extra columns
    x = packed[:, : 7 * 32].view(5, 7, 32)  # strided rows, like a slice of the qkv output
    ang = torch.rand(5, 16, generator=gen).to(device)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(dtype)
    sin = torch.cat([-ang.sin(), ang.sin()], -1)[:, None, :].to(dtype)  # signed, as lookup()
    out = rotary_apply_gathered(x, cos, sin)
    ref = _ref_rotate(x, cos[..., :16].double(), sin[..., 16:].double())
    assert out.is_contiguous() and rel_err(out, ref) < tol(dtype)


def test_qk_rmsnorm_on_strided_view(device, dtype):
    from sgdsl.runtime.kernels.rmsnorm import qk_rmsnorm

    gen = torch.Generator().manual_seed(3)
    qkv = _rand(5, 7 * 16, gen=gen, dtype=dtype, device=device)  # 4 q + 2 k + 1 v heads
    qk = qkv[:, : 6 * 16].view(5, 6, 16)  # strided: rows of 7 heads
    wq, wk = (_rand(16, gen=gen, dtype=dtype, device=device) for _ in range(2))
    out = qk_rmsnorm(qk, wq, wk, 4, 1e-6)
    assert rel_err(out[:, :4], _ref_rmsnorm(qk[:, :4], wq, 1e-6)) < tol(dtype)
    assert rel_err(out[:, 4:], _ref_rmsnorm(qk[:, 4:], wk, 1e-6)) < tol(dtype)

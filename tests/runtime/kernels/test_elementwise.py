"""Fused add+RMSNorm, rotary, SiLU-and-mul and KV store vs torch references."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.activation import silu_and_mul
from sgdsl.runtime.kernels.kv_store import store_kv
from sgdsl.runtime.kernels.rmsnorm import fused_add_rmsnorm, rmsnorm
from sgdsl.runtime.kernels.rotary import build_cos_sin_cache, rotary_embedding

from .conftest import ON_GPU, rel_err, tol


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


@pytest.mark.parametrize("store", [False, True])
def test_qk_norm_rope_is_norm_then_rotary(device, dtype, store):
    """q/k norm + rotary in one kernel; with a KV target the rotated k and the v heads also
    land at their slots (the same bytes store_kv writes)."""
    from sgdsl.runtime.kernels.qk_norm_rope import qk_norm_rope
    from sgdsl.runtime.layers.attention.base import KVStoreTarget

    gen = torch.Generator().manual_seed(6)
    qkv = _rand(5, 8 * 32 + 8, gen=gen, dtype=dtype, device=device)  # 4 q, 2 k, 2 v + extra
    heads = qkv[:, : 8 * 32].view(5, 8, 32)  # strided rows, like a view of the qkv output
    wq, wk = (_rand(32, gen=gen, dtype=dtype, device=device) for _ in range(2))
    ang = torch.rand(5, 16, generator=gen).to(device)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(dtype)
    sin = torch.cat([-ang.sin(), ang.sin()], -1)[:, None, :].to(dtype)  # signed, as lookup()
    k_buf, v_buf = (torch.zeros(16, 2, 32, dtype=dtype, device=device) for _ in range(2))
    loc = torch.tensor([9, 2, 15, 4, 1], device=device)
    target = KVStoreTarget(k_buf, v_buf, loc, 1.0, 1.0) if store else None
    out = qk_norm_rope(heads, wq, wk, 4, 1e-6, cos, sin, store=target)
    normed = torch.cat([_ref_rmsnorm(heads[:, :4], wq, 1e-6),
                        _ref_rmsnorm(heads[:, 4:6], wk, 1e-6)], 1)
    ref = _ref_rotate(normed, cos[..., :16].double(), sin[..., 16:].double())
    assert out.is_contiguous() and out.shape == (5, 6, 32) and rel_err(out, ref) < tol(dtype)
    if store:
        assert torch.equal(k_buf[loc], out[:, 4:]) and torch.equal(v_buf[loc], heads[:, 6:])
        assert int((k_buf != 0).any(-1).any(-1).sum()) == 5, "only the 5 slots written"
    else:
        assert not k_buf.any() and not v_buf.any()


@pytest.mark.parametrize("store", [False, True])
def test_qk_rope_without_norms_is_the_rotary(device, dtype, store):
    """Llama's path (no q/k norms): the rotary of q and k, as the rotary kernel computes it,
    and with a KV target the rotated k and the v heads at their slots."""
    from sgdsl.runtime.kernels.qk_norm_rope import qk_norm_rope
    from sgdsl.runtime.kernels.rotary import rotary_apply_gathered
    from sgdsl.runtime.layers.attention.base import KVStoreTarget

    gen = torch.Generator().manual_seed(9)
    heads = _rand(3, 10 * 64, gen=gen, dtype=dtype, device=device).view(3, 10, 64)  # 6+2+2
    ang = torch.rand(3, 32, generator=gen).to(device)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(dtype)
    sin = torch.cat([-ang.sin(), ang.sin()], -1)[:, None, :].to(dtype)  # signed, as lookup()
    k_buf, v_buf = (torch.zeros(8, 2, 64, dtype=dtype, device=device) for _ in range(2))
    loc = torch.tensor([6, 1, 3], device=device)
    target = KVStoreTarget(k_buf, v_buf, loc, 1.0, 1.0) if store else None
    out = qk_norm_rope(heads, None, None, 6, 0.0, cos, sin, store=target)
    ref = _ref_rotate(heads[:, :8], cos[..., :32].double(), sin[..., 32:].double())
    assert out.shape == (3, 8, 64) and rel_err(out, ref) < tol(dtype)
    assert rel_err(out, rotary_apply_gathered(heads[:, :8], cos, sin)) < 1e-6
    if store:
        assert torch.equal(k_buf[loc], out[:, 6:]) and torch.equal(v_buf[loc], heads[:, 8:])
        assert int((k_buf != 0).any(-1).any(-1).sum()) == 3, "only the 3 slots written"
    else:
        assert not k_buf.any() and not v_buf.any()


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="fp8 stores need a CUDA device")
def test_qk_norm_rope_fp8_store_matches_store_kv():
    from sgdsl.runtime.kernels.qk_norm_rope import qk_norm_rope
    from sgdsl.runtime.layers.attention.base import KVStoreTarget

    gen = torch.Generator().manual_seed(8)
    heads = torch.randn(3, 8, 64, generator=gen).bfloat16().cuda()
    wq, wk = (torch.randn(64, generator=gen).bfloat16().cuda() for _ in range(2))
    ang = torch.rand(3, 32, generator=gen).cuda()
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].bfloat16()
    sin = torch.cat([-ang.sin(), ang.sin()], -1)[:, None, :].bfloat16()
    bufs = [torch.zeros(8, 2, 64, dtype=torch.float8_e4m3fn, device="cuda") for _ in range(4)]
    loc = torch.tensor([5, 0, 7], device="cuda")
    out = qk_norm_rope(heads, wq, wk, 4, 1e-6, cos, sin,
                       store=KVStoreTarget(bufs[0], bufs[1], loc, 0.5, 2.0))
    store_kv(out[:, 4:], heads[:, 6:], bufs[2], bufs[3], loc, k_scale=0.5, v_scale=2.0)
    assert torch.equal(bufs[0].view(torch.uint8), bufs[2].view(torch.uint8))
    assert torch.equal(bufs[1].view(torch.uint8), bufs[3].view(torch.uint8))


def test_fused_add_rmsnorm_sums_parts(device, dtype):
    """x [rows, parts, hidden] (a MoE layer's weighted expert rows): the same result as the
    combine kernel followed by the plain fused add+RMSNorm, bit for bit."""
    from sgdsl.runtime.kernels.fused_moe import combine

    gen = torch.Generator().manual_seed(7)
    x = _rand(4, 3, 64, gen=gen, dtype=dtype, device=device)
    r = _rand(4, 64, gen=gen, dtype=dtype, device=device)
    w = _rand(64, gen=gen, dtype=dtype, device=device)
    out, res = fused_add_rmsnorm(x, r, w, 1e-6, inplace=False)
    s = x.double().sum(1) + r.double()
    assert rel_err(res, s) < tol(dtype) and rel_err(out, _ref_rmsnorm(s, w, 1e-6)) < tol(dtype)
    want_out, want_res = fused_add_rmsnorm(combine(x.view(12, 64), 4, 3), r, w, 1e-6,
                                           inplace=False)
    assert torch.equal(out, want_out) and torch.equal(res, want_res)

"""The batch-1 products with a paired-row epilogue (gemv_pairs.py) vs float64 references: gate_up
with SiLU-and-mul, qkv with the rotary and the KV-pool store; plain weights under Triton's
interpreter on CPU (several tiles, shapes that are not multiples of them, norm and bias folded
in), fp8 weights and an fp8 pool on the GPU."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.gemv_pairs import gemv_rope, gemv_silu
from sgdsl.runtime.layers.attention.base import KVStoreTarget
from sgdsl.runtime.layers.quantization.fp8_utils import dequantize, quantize_rows

from .conftest import ON_GPU, rel_err, tol

TILES = [None, (2, 256, 1), (4, 512, 2), (1, 1024, 4), (1, 2048, 2), (1, 4096, 8)]  # + wide defaults


def _rand(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale


def _silu_ref(x, w, bias=None, norm=None):
    x = x.double()
    if norm is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm[1]) * norm[0].double()
    y = x @ w.double().T
    if bias is not None:
        y = y + bias.double()
    g, u = y.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("inter,k", [(35, 300), (64, 1024)])
def test_gemv_silu_plain_weight(device, dtype, tile, inter, k):
    gen = torch.Generator().manual_seed(inter + k)
    x = _rand(gen, 1, k).to(dtype).to(device)
    w = _rand(gen, 2 * inter, k, scale=k ** -0.5).to(dtype).to(device)
    out = gemv_silu(x, w, None, tile)
    assert out.shape == (1, inter) and out.dtype == dtype
    assert rel_err(out, _silu_ref(x, w)) < tol(dtype)


def test_gemv_silu_norm_and_bias(device, dtype):
    gen = torch.Generator().manual_seed(7)
    x = _rand(gen, 1, 300, scale=3.0).to(dtype).to(device)
    w = _rand(gen, 2 * 70, 300, scale=0.06).to(dtype).to(device)
    nw = (torch.rand(300, generator=gen) + 0.5).to(dtype).to(device)
    bias = _rand(gen, 140).to(dtype).to(device)
    out = gemv_silu(x, w, None, (2, 256, 1), norm=(nw, 1e-5), bias=bias)
    assert rel_err(out, _silu_ref(x, w, bias, (nw, 1e-5))) < tol(dtype)


def _rope_tables(gen, head_dim, device, dtype):
    """cos and signed sin ``[1, 1, D]`` as ``RotaryEmbedding.lookup`` returns them."""
    ang = torch.rand(head_dim // 2, generator=gen) * 6.0
    cos = torch.cat([ang.cos(), ang.cos()]).view(1, 1, -1)
    sin = torch.cat([-ang.sin(), ang.sin()]).view(1, 1, -1)
    return cos.to(dtype).to(device), sin.to(dtype).to(device)


def _rope_ref(qkv, q_heads, kv_heads, cos, sin):
    """float64 [heads, D]: q and k rotated (neox), v as projected."""
    heads = qkv.double().view(q_heads + 2 * kv_heads, -1).clone()
    half = heads.shape[1] // 2
    c, s = cos.double().view(-1)[:half], sin.double().view(-1)[half:]
    x1, x2 = heads[:q_heads + kv_heads, :half].clone(), heads[:q_heads + kv_heads, half:].clone()
    heads[:q_heads + kv_heads, :half] = x1 * c - x2 * s
    heads[:q_heads + kv_heads, half:] = x2 * c + x1 * s
    return heads


def _rope_case(device, dtype, q_heads, kv_heads, head_dim, k, tile, seed, bias=False,
               pool_dtype=None, fp8=False):
    gen = torch.Generator().manual_seed(seed)
    n = (q_heads + 2 * kv_heads) * head_dim
    x = _rand(gen, 1, k).to(dtype).to(device)
    w = _rand(gen, n, k, scale=k ** -0.5)
    if fp8:
        wq, scale = quantize_rows(w)
        w_ref, w, scale = dequantize(wq, scale), wq.to(device), scale.to(device)
    else:
        w = w.to(dtype).to(device)
        w_ref, scale = w, None
    b = _rand(gen, n).to(dtype).to(device) if bias else None
    cos, sin = _rope_tables(gen, head_dim, device, dtype)
    pool_dtype = pool_dtype or dtype
    slots = 6
    k_buf = torch.full((slots, kv_heads, head_dim), 7.0, device=device).to(pool_dtype)
    v_buf = torch.full((slots, kv_heads, head_dim), 7.0, device=device).to(pool_dtype)
    pool_scale = 0.5 if pool_dtype == torch.float8_e4m3fn else 1.0
    loc = torch.tensor([4], device=device)
    store = KVStoreTarget(k_buf, v_buf, loc, pool_scale, pool_scale)
    out = gemv_rope(x, w, scale, q_heads, kv_heads, cos, sin, store, tile, bias=b)
    assert out.shape == (1, n) and out.dtype == dtype
    qkv_ref = x.double().cpu() @ w_ref.double().cpu().T
    if b is not None:
        qkv_ref = qkv_ref + b.double().cpu()
    ref = _rope_ref(qkv_ref, q_heads, kv_heads, cos.cpu(), sin.cpu())
    loose = 3e-2 if fp8 or pool_dtype == torch.float8_e4m3fn else tol(dtype)
    assert rel_err(out.view_as(ref).cpu(), ref) < loose
    stored_k = k_buf[4].double().cpu() * pool_scale
    stored_v = v_buf[4].double().cpu() * pool_scale
    assert rel_err(stored_k, ref[q_heads:q_heads + kv_heads]) < loose
    assert rel_err(stored_v, ref[q_heads + kv_heads:]) < loose
    others = [i for i in range(slots) if i != 4]  # only the token's slot is written
    assert (k_buf[others].float() == 7.0).all() and (v_buf[others].float() == 7.0).all()


@pytest.mark.parametrize("tile", TILES)
def test_gemv_rope_stores_kv(device, dtype, tile):
    # GQA 4/2 heads, head_dim 16, K not a multiple of any block
    _rope_case(device, dtype, 4, 2, 16, 300, tile, seed=1)


def test_gemv_rope_bias_mha(device, dtype):
    # 6 heads of 5 pairs: 30 pairs, not a multiple of the tile's 4
    _rope_case(device, dtype, 2, 2, 10, 256, (4, 256, 1), seed=2, bias=True)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="fp8 needs CUDA")
@pytest.mark.parametrize("tile", [None, (2, 2048, 1), (1, 2048, 2)])
@pytest.mark.parametrize("pool", ["bf16", "fp8"])
def test_gpu_fp8_weights_llama8b_shapes(tile, pool):
    pool_dtype = torch.float8_e4m3fn if pool == "fp8" else torch.bfloat16
    _rope_case("cuda", torch.bfloat16, 32, 8, 128, 4096, tile, seed=3, pool_dtype=pool_dtype,
               fp8=True)
    gen = torch.Generator().manual_seed(4)
    w = _rand(gen, 2 * 14336, 4096, scale=0.05)
    wq, scale = quantize_rows(w)
    x = _rand(gen, 1, 4096).bfloat16().cuda()
    out = gemv_silu(x, wq.cuda(), scale.cuda(), tile)
    assert rel_err(out.cpu(), _silu_ref(x.cpu(), dequantize(wq, scale))) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="compares with the separate CUDA kernels")
def test_gpu_same_values_as_separate_kernels():
    """bf16 Llama-3.1-8B shapes: the epilogues round as the separate kernels do, so the
    results differ from theirs by at most one bf16 rounding step here and there."""
    from sgdsl.runtime.kernels.activation import silu_and_mul
    from sgdsl.runtime.kernels.gemv import gemv
    from sgdsl.runtime.kernels.qk_norm_rope import qk_norm_rope

    gen = torch.Generator().manual_seed(5)
    x = _rand(gen, 1, 4096).bfloat16().cuda()
    w = _rand(gen, 2 * 14336, 4096, scale=0.02).bfloat16().cuda()
    sep = silu_and_mul(gemv(x, w, None, (2, 2048, 4)))
    assert rel_err(gemv_silu(x, w), sep.float()) < 4e-3
    w = _rand(gen, 48 * 128, 4096, scale=0.02).bfloat16().cuda()
    cos, sin = _rope_tables(gen, 128, "cuda", torch.bfloat16)
    qk = qk_norm_rope(gemv(x, w, None, (2, 2048, 4)).view(1, 48, 128), None, None, 32, 0.0,
                      cos, sin)
    fused = gemv_rope(x, w, None, 32, 8, cos, sin).view(1, 48, 128)
    assert rel_err(fused[:, :40], qk.float()) < 4e-3

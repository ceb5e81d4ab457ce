"""Programmatic dependent launch (kernels/pdl.py): every converted kernel gives the same bits
with PDL on as off (PDL changes only when a kernel starts, never what it computes).

Under Triton's interpreter (CPU) the PDL variants' code runs with the wait a no-op: the
matrix-vector products' first weight block (or first three: ``SGDSL_GEMV_PRE``) loaded before
the wait and summed outside the loop, the launch keyword. On the GPU (``-m gpu``): the same kernels eagerly, a chain of products
feeding each other at Llama-3.1-8B TP=4 shapes replayed in a CUDA graph (a missing wait would
read a stale input), and a small bf16 Llama's decode logits with CUDA graphs."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels import pdl
from sgdsl.runtime.kernels.activation import silu_and_mul
from sgdsl.runtime.kernels.decode_attention import decode_attention_fwd, decode_stage1
from sgdsl.runtime.kernels.gemv import gemv
from sgdsl.runtime.kernels.gemv_pairs import gemv_rope, gemv_silu
from sgdsl.runtime.kernels.kv_store import store_kv
from sgdsl.runtime.kernels.qk_norm_rope import qk_norm_rope
from sgdsl.runtime.kernels.rmsnorm import fused_add_rmsnorm, rmsnorm
from sgdsl.runtime.layers.attention.base import KVStoreTarget

from .conftest import ON_GPU, graph_decode
from .paged import scattered_pool


@pytest.fixture(autouse=True)
def _pdl_reset():
    yield
    pdl.set_enabled(None)


def _both(fn):
    """``fn()``'s tensors with PDL off, then on (cloned: some kernels write in place)."""
    outs = []
    for on in (False, True):
        pdl.set_enabled(on)
        res = fn()
        outs.append([t.clone() for t in (res if isinstance(res, (tuple, list)) else [res])])
    pdl.set_enabled(None)
    return outs


def _assert_same_bits(outs):
    off, on = outs
    assert len(off) == len(on)
    for a, b in zip(off, on):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_switch_and_launch_keywords(monkeypatch):
    x = torch.zeros(1)
    assert pdl.launch(False) == {"PDL": False}  # no launch_pdl: older Tritons never see it
    monkeypatch.delenv("SGDSL_PDL_TRIGGER", raising=False)
    assert pdl.launch(True) == {"PDL": pdl.EARLY, "launch_pdl": True}  # default: early
    monkeypatch.setenv("SGDSL_PDL_TRIGGER", "wait")  # as first built
    assert pdl.launch(True) == {"PDL": True, "launch_pdl": True}
    assert pdl.launch(False) == {"PDL": False}
    pdl.set_enabled(False)
    assert not pdl.enabled(x) and not pdl.all_reduce_enabled(x)
    pdl.set_enabled(True)
    on_here = pdl._INTERPRET  # a CPU tensor compiled for real: never
    assert pdl.enabled(x) == on_here
    monkeypatch.setenv("SGDSL_PDL_ALL_REDUCE", "0")
    assert not pdl.all_reduce_enabled(x)
    if ON_GPU:
        y = torch.zeros(1, device="cuda")
        assert pdl.enabled(y) == pdl.supported(y.device.index or 0)


@pytest.fixture(params=[1, 3], ids=["pre1", "pre3"])
def pre(request, monkeypatch):
    """Weight blocks loaded before the wait (``pdl.pre_blocks``): the first only, or three
    (clamped to the row's blocks where it has fewer; and the next grid let launch before the
    wait, ``SGDSL_PDL_TRIGGER=early``): the same bits either way."""
    monkeypatch.setenv("SGDSL_GEMV_PRE", str(request.param))
    monkeypatch.setenv("SGDSL_GEMV_PAIRS_PRE", str(request.param))
    monkeypatch.setenv("SGDSL_PDL_TRIGGER", "early" if request.param > 1 else "wait")
    return request.param


def test_pre_blocks_within_the_row(monkeypatch):
    monkeypatch.delenv("SGDSL_GEMV_PRE", raising=False)
    monkeypatch.delenv("SGDSL_GEMV_PAIRS_PRE", raising=False)
    assert pdl.pre_blocks(4096, 1024, True) == 4  # the defaults: 4 (gemv), 2 (pairs)
    assert pdl.pre_blocks(4096, 1024, True, "SGDSL_GEMV_PAIRS_PRE") == 2
    monkeypatch.setenv("SGDSL_GEMV_PRE", "1")  # as first built
    assert pdl.pre_blocks(4096, 1024, True) == 1
    monkeypatch.setenv("SGDSL_GEMV_PRE", "4")
    assert pdl.pre_blocks(4096, 1024, True) == 4
    assert pdl.pre_blocks(1024, 1024, True) == 1  # one block in the row
    assert pdl.pre_blocks(3584, 1024, True) == 4  # 3.5 blocks: the last one partial
    assert pdl.pre_blocks(4096, 1024, False) == 1  # no PDL: one compiled variant
    monkeypatch.setenv("SGDSL_GEMV_PAIRS_PRE", "2")
    assert pdl.pre_blocks(4096, 1024, True, "SGDSL_GEMV_PAIRS_PRE") == 2


@pytest.mark.parametrize("n,k,tile", [(10, 300, (2, 256, 1)), (6, 1024, None),
                                      (5, 1024 + 96, (2, 512, 2))])
@pytest.mark.parametrize("fused", [False, True], ids=["plain", "norm_bias_res"])
def test_gemv(device, dtype, n, k, tile, fused, pre):
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(dtype).to(device)
    extra = {}
    if fused:
        extra = dict(norm=((torch.rand(k, generator=gen) + 0.5).to(dtype).to(device), 1e-5),
                     bias=torch.randn(n, generator=gen).to(dtype).to(device),
                     residual=torch.randn(1, n, generator=gen).to(dtype).to(device))
    _assert_same_bits(_both(lambda: gemv(x, w, None, tile, **extra)))


@pytest.mark.parametrize("tile", [None, (2, 128, 1)])
def test_gemv_pairs(device, dtype, tile, pre):
    gen = torch.Generator().manual_seed(5)
    k, q_heads, kv_heads, d = 300, 2, 1, 8
    x = torch.randn(1, k, generator=gen).to(dtype).to(device)
    w = (torch.randn((q_heads + 2 * kv_heads) * d, k, generator=gen) * 0.06).to(dtype).to(device)
    nw = (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device)
    ang = torch.rand(d // 2, generator=gen) * 6.0
    cos = torch.cat([ang.cos(), ang.cos()]).view(1, 1, -1).to(dtype).to(device)
    sin = torch.cat([-ang.sin(), ang.sin()]).view(1, 1, -1).to(dtype).to(device)

    def rope():
        pool = [torch.zeros(5, kv_heads, d, dtype=dtype, device=device) for _ in range(2)]
        store = KVStoreTarget(*pool, torch.tensor([3], device=device), 1.0, 1.0)
        out = gemv_rope(x, w, None, q_heads, kv_heads, cos, sin, store, tile, norm=(nw, 1e-5))
        return out, *pool

    _assert_same_bits(_both(rope))
    _assert_same_bits(_both(lambda: gemv_silu(x, w, None, tile, norm=(nw, 1e-5))))


def test_norm_activation_store_rope(device, dtype):
    gen = torch.Generator().manual_seed(6)
    x, r = (torch.randn(3, 96, generator=gen).to(dtype).to(device) for _ in range(2))
    nw = (torch.rand(96, generator=gen) + 0.5).to(dtype).to(device)
    _assert_same_bits(_both(lambda: rmsnorm(x, nw, 1e-5)))
    _assert_same_bits(_both(lambda: fused_add_rmsnorm(x, r, nw, 1e-5, inplace=False)))
    _assert_same_bits(_both(lambda: silu_and_mul(x)))
    qkv = torch.randn(2, 8, 16, generator=gen).to(dtype).to(device)  # 4 q, 2 k, 2 v heads
    cos = torch.rand(2, 1, 16, generator=gen).to(dtype).to(device)
    sin = torch.rand(2, 1, 16, generator=gen).to(dtype).to(device)
    hw = (torch.rand(16, generator=gen) + 0.5).to(dtype).to(device)

    def store_and_rope():
        pool = [torch.zeros(6, 2, 16, dtype=dtype, device=device) for _ in range(2)]
        loc = torch.tensor([4, 1], device=device)
        store_kv(qkv[:, 4:6], qkv[:, 6:], *pool, loc)
        store = KVStoreTarget(*[p.clone().zero_() for p in pool], loc, 1.0, 1.0)
        out = qk_norm_rope(qkv, hw, hw, 4, 1e-5, cos, sin, store=store)
        return out, *pool, store.k_buf, store.v_buf

    _assert_same_bits(_both(store_and_rope))


@pytest.mark.parametrize("pre_kv", ["0", "1"])
def test_decode_attention(device, dtype, monkeypatch, pre_kv):
    """``SGDSL_ATTN_PRE=1``: the page table and the earlier tokens' K/V read before the wait
    (the newest token's after it): the same bits."""
    monkeypatch.setenv("SGDSL_ATTN_PRE", pre_kv)
    gen = torch.Generator().manual_seed(7)
    lens = [5, 40]
    k_buf, v_buf, r2t, rows = scattered_pool(lens, 2, 16, dtype, device, gen)
    q = torch.randn(2, 4, 16, generator=gen).to(dtype).to(device)
    sl = torch.tensor(lens, device=device)

    def attend():
        out = torch.empty_like(q)
        mid_o = torch.empty(2, 4, 4, 16, device=device)
        mid_lse = torch.empty(2, 4, 4, device=device)
        decode_attention_fwd(q, k_buf, v_buf, out, r2t, rows, sl, None, mid_o, mid_lse, 0.25,
                             4, min_tokens_per_split=16)
        return out

    def suffix():  # a cascade's stage 1: tokens from ``starts`` on (the shared prefix's apart)
        mid_o = torch.zeros(2, 4, 4, 16, device=device)
        mid_lse = torch.zeros(2, 4, 4, device=device)
        decode_stage1(q, k_buf, v_buf, r2t, rows, sl, None, mid_o, mid_lse, 0.25, 4,
                      starts=torch.tensor([2, 7], device=device), min_tokens_per_split=16)
        return mid_o, mid_lse

    _assert_same_bits(_both(attend))
    _assert_same_bits(_both(suffix))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="fp8 weights need CUDA")
def test_gpu_fp8_weights_and_pool():
    from sgdsl.runtime.layers.quantization.fp8_utils import quantize_rows

    _require_pdl()
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1, 4096, device="cuda", generator=gen).to(torch.bfloat16)
    w, scale = quantize_rows(torch.randn(1536, 4096, device="cuda", generator=gen) * 0.02)
    _assert_same_bits(_both(lambda: gemv(x, w, scale)))
    _assert_same_bits(_both(lambda: gemv_silu(x, w, scale)))
    cos = torch.rand(1, 1, 128, device="cuda", generator=gen).to(torch.bfloat16)
    sin = torch.rand(1, 1, 128, device="cuda", generator=gen).to(torch.bfloat16)

    def rope():  # 8 q heads, 2 kv heads (8B at TP=4), an fp8 pool
        pool = [torch.zeros(4, 2, 128, device="cuda").to(torch.float8_e4m3fn) for _ in range(2)]
        store = KVStoreTarget(*pool, torch.tensor([2], device="cuda"), 0.5, 0.5)
        return gemv_rope(x, w, scale, 8, 2, cos, sin, store), *pool

    _assert_same_bits(_both(rope))


def _require_pdl() -> None:
    if not pdl.supported(torch.cuda.current_device()):
        pytest.skip("no PDL here (compute capability < 9.0 or a Triton without gdc_wait)")


def _chain_graph(on: bool, x: torch.Tensor, ws: list[torch.Tensor], nw: torch.Tensor):
    """A CUDA graph of 8B TP=4 batch-1 shapes, each kernel reading the one before's output:
    (o_proj + residual, norm, gate_up + SiLU, down + residual) x 4 layers."""
    pdl.set_enabled(on)
    o, gate_up, down = ws

    def step():
        h = x
        for _ in range(4):
            h = gemv(h[:, :1024].contiguous(), o, residual=h)  # o_proj: K = 1024
            h = rmsnorm(h, nw, 1e-5)
            act = gemv_silu(h, gate_up)
            h = gemv(act, down, norm=(nw[:3584], 1e-5), residual=h)
        return h

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    pdl.set_enabled(None)
    return graph, out


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
def test_gpu_chain_in_cuda_graph_same_bits():
    _require_pdl()
    gen = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(1, 4096, device="cuda", generator=gen).to(bf)
    ws = [(torch.randn(*s, device="cuda", generator=gen) * s[1] ** -0.5).to(bf)
          for s in ((4096, 1024), (2 * 3584, 4096), (4096, 3584))]
    nw = (torch.rand(4096, device="cuda", generator=gen) + 0.5).to(bf)
    g_off, out_off = _chain_graph(False, x, ws, nw)
    g_on, out_on = _chain_graph(True, x, ws, nw)
    for i in range(20):  # a new input each replay: a kernel reading too early sees the old one
        x.copy_(torch.randn(1, 4096, device="cuda", generator=gen).to(bf))
        g_off.replay()
        g_on.replay()
        torch.cuda.synchronize()
        assert torch.equal(out_off, out_on), f"replay {i}"


def _decode_logits(path, on: bool) -> list[torch.Tensor]:
    pdl.set_enabled(on)
    try:
        return graph_decode(path)[1]
    finally:
        pdl.set_enabled(None)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
@pytest.mark.parametrize("fusion", ["0", "1"], ids=["epilogues", "adds_folded"])
def test_gpu_tiny_llama_decode_in_cuda_graphs_same_logits(tiny_llama_dir, fusion, monkeypatch):
    """Batch-1 decode with CUDA graphs (qkv + rotary + KV store, attention, o_proj, gate_up +
    SiLU, down; with ``SGDSL_GEMV_FUSION=1`` the adds in the products too): PDL's logits are
    the same bits, every step (greedy, so the same tokens too)."""
    _require_pdl()
    monkeypatch.setenv("SGDSL_GEMV_FUSION", fusion)
    off, on = _decode_logits(tiny_llama_dir, False), _decode_logits(tiny_llama_dir, True)
    assert len(off) == len(on) == 17
    for i, (a, b) in enumerate(zip(off, on)):
        assert torch.equal(a, b), f"step {i}"

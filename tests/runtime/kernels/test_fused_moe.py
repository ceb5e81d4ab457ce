"""Fused MoE (Triton, expert-sorted grouped GEMMs) and its token alignment vs the per-expert
torch loop; fp8 expert weights (per-channel and 128x128 blocks) vs the dequantized reference."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.fused_moe import fused_moe
from sgdsl.runtime.kernels.moe_routing import topk_softmax
from sgdsl.runtime.layers.moe import align as align_mod
from sgdsl.runtime.layers.moe.align import align_by_expert, align_pairs, max_padded_len
from sgdsl.runtime.layers.moe.reference import moe_reference
from sgdsl.runtime.layers.moe.router import select_experts
from sgdsl.runtime.layers.quantization.fp8_utils import dequantize, quantize_blocks, quantize_rows

from .conftest import ON_GPU, rel_err, tol


def _experts(e, hidden, inter, gen, dtype, device):
    w13 = (torch.randn(e, 2 * inter, hidden, generator=gen) / hidden ** 0.5).to(dtype).to(device)
    w2 = (torch.randn(e, hidden, inter, generator=gen) / inter ** 0.5).to(dtype).to(device)
    return w13, w2


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 8, 2), (7, 4, 4), (40, 6, 2)])
def test_align_by_expert(tokens, experts, top_k):
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    block = 4
    a = align_by_expert(ids.int(), experts, block)
    n = tokens * top_k
    assert a.sorted_ids.shape[0] == max_padded_len(n, experts, block)
    used = int(a.num_padded)
    real = a.sorted_ids[:used]
    assert sorted(real[real < n].tolist()) == list(range(n)), "every pair exactly once"
    assert bool((a.sorted_ids[used:] == n).all())
    flat = ids.flatten()
    for b in range(used // block):
        rows = a.sorted_ids[b * block:(b + 1) * block]
        rows = rows[rows < n].long()
        assert bool((flat[rows] == a.block_expert[b]).all()), "a block holds one expert"


def test_align_pairs_one_block_per_pair():
    ids = torch.tensor([[3, 1], [1, 0]], dtype=torch.int32)
    a = align_pairs(ids, 4)
    assert a.sorted_ids.tolist() == [0, 4, 4, 4, 1, 4, 4, 4, 2, 4, 4, 4, 3, 4, 4, 4]
    assert a.block_expert.tolist() == [3, 1, 1, 0] and int(a.num_padded) == 16


@pytest.mark.parametrize("experts,top_k,renorm", [(8, 2, True), (128, 8, True), (6, 3, False)])
def test_topk_softmax_kernel(device, experts, top_k, renorm):
    gen = torch.Generator().manual_seed(experts)
    logits = torch.randn(5, experts, generator=gen).to(device)
    weights, ids = topk_softmax(logits, top_k, renorm)
    probs = torch.softmax(logits.double(), -1)
    want_w, want_ids = torch.topk(probs, top_k, -1)
    if renorm:
        want_w = want_w / want_w.sum(-1, keepdim=True)
    assert ids.dtype == torch.int32 and torch.equal(ids.long().cpu(), want_ids.cpu())
    assert torch.allclose(weights.double().cpu(), want_w.cpu(), atol=1e-6)


@pytest.mark.parametrize("first,count", [(0, 4), (4, 4), (96, 32)])
def test_topk_softmax_local_ids(device, first, count):
    """Expert parallelism's all_reduce path: ids local to one rank's experts ``[first,
    first + count)``, ``count`` for the others; weights as without; the torch path agrees."""
    experts = 128 if count == 32 else 8
    gen = torch.Generator().manual_seed(first)
    logits = torch.randn(6, experts, generator=gen).to(device)
    w_all, ids_all = topk_softmax(logits, 4, True)
    weights, ids = topk_softmax(logits, 4, True, local=(first, count))
    rel = ids_all.long() - first
    want = torch.where((rel >= 0) & (rel < count), rel, count)
    assert ids.dtype == torch.int32 and torch.equal(ids.long().cpu(), want.cpu())
    assert torch.equal(weights.cpu(), w_all.cpu())
    cpu_w, cpu_ids = select_experts(logits.cpu(), 4, True, local=(first, count))
    assert torch.equal(cpu_ids, want.int().cpu())
    assert torch.allclose(cpu_w.double(), weights.double().cpu(), atol=1e-6)


@pytest.mark.parametrize("pair_blocks", [32, 0])  # decode layout / sorted by expert
@pytest.mark.parametrize("tokens,experts,top_k,hidden,inter", [
    (1, 8, 2, 64, 32), (5, 4, 2, 48, 40), (33, 8, 3, 64, 64)])
def test_fused_moe_matches_reference(device, dtype, tokens, experts, top_k, hidden, inter,
                                     pair_blocks, monkeypatch):
    monkeypatch.setattr(align_mod, "PAIR_BLOCKS_MAX", pair_blocks)
    gen = torch.Generator().manual_seed(tokens + experts)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(device)
    w13, w2 = _experts(experts, hidden, inter, gen, dtype, device)
    logits = torch.randn(tokens, experts, generator=gen).to(device)
    weights, ids = select_experts(logits, top_k, renormalize=True)
    out = fused_moe(x, w13, w2, weights, ids)
    ref = moe_reference(x.double(), lambda e: (w13[e].double(), w2[e].double()), weights, ids)
    assert out.shape == (tokens, hidden) and out.dtype == dtype
    assert rel_err(out, ref) < tol(dtype)
    rows = fused_moe(x, w13, w2, weights, ids, sum_experts=False)  # the combine left out
    assert rows.shape == (tokens, top_k, hidden)
    assert torch.equal(rows.float().sum(1).to(dtype), out)


@pytest.mark.parametrize("pair_blocks", [32, 0])
def test_fused_moe_skips_padding_pairs(device, dtype, pair_blocks, monkeypatch):
    """Expert parallelism's skipped pairs (id E): padding rows of the padded dispatch give zero
    rows; the real rows equal the reference."""
    monkeypatch.setattr(align_mod, "PAIR_BLOCKS_MAX", pair_blocks)
    gen = torch.Generator().manual_seed(3)
    experts, rows, hidden, inter = 4, 24, 48, 40
    x = torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
    w13, w2 = _experts(experts, hidden, inter, gen, dtype, device)
    ids = torch.randint(0, experts, (rows, 1), generator=gen, dtype=torch.int32)
    pad = torch.arange(rows) % 3 == 1
    ids[pad] = experts
    ones = torch.ones(rows, 1, device=device)
    out = fused_moe(x, w13, w2, ones, ids.to(device))
    real = ~pad
    ref = moe_reference(x[real.to(device)].double(), lambda e: (w13[e].double(), w2[e].double()),
                        ones[real.to(device)], ids[real].to(device))
    assert rel_err(out[real.to(device)], ref) < tol(dtype)
    assert not out[pad.to(device)].any()  # skipped pairs add nothing
    # top_k > 1 with some pairs skipped (all_reduce EP: another rank's experts): the sum of
    # the kept ones
    ids2 = torch.randint(0, experts + 1, (rows // 2, 3), generator=gen, dtype=torch.int32)
    w = torch.rand(rows // 2, 3, generator=gen)
    keep = ids2 < experts
    got = fused_moe(x[:rows // 2], w13, w2, w.to(device), ids2.to(device))
    ref = moe_reference(x[:rows // 2].double(), lambda e: (w13[e].double(), w2[e].double()),
                        (w * keep).to(device), ids2.clamp(max=experts - 1).to(device))
    assert rel_err(got, ref) < tol(dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="fp8 tensor math needs a CUDA device")
@pytest.mark.parametrize("block", [None, (128, 128)])
@pytest.mark.parametrize("tokens", [1, 200])
def test_fused_moe_fp8_weights(block, tokens):
    gen = torch.Generator().manual_seed(7)
    experts, top_k, hidden, inter = 8, 2, 256, 256
    x = torch.randn(tokens, hidden, generator=gen).bfloat16().cuda()
    w13, w2 = _experts(experts, hidden, inter, gen, torch.float32, "cpu")
    quant = (lambda w: quantize_rows(w)) if block is None else (lambda w: quantize_blocks(w, block))
    q13, s13 = zip(*(quant(w13[e]) for e in range(experts)))
    q2, s2 = zip(*(quant(w2[e]) for e in range(experts)))
    q13, q2 = torch.stack(q13).cuda(), torch.stack(q2).cuda()
    s13, s2 = torch.stack(s13).cuda(), torch.stack(s2).cuda()
    weights, ids = select_experts(torch.randn(tokens, experts, generator=gen).cuda(), top_k, True)
    out = fused_moe(x, q13, q2, weights, ids, s13, s2, block)
    ref = moe_reference(x.double(), lambda e: (dequantize(q13[e], s13[e], block).double(),
                                               dequantize(q2[e], s2[e], block).double()),
                        weights, ids)
    assert rel_err(out, ref) < 2e-2

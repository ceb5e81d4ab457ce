"""The GPU decode path's Triton kernels at the embedded SmolLM2-135M's exact shapes (hidden 576,
not a multiple of any GEMV block; 9 query / 3 KV heads of 64; MLP 1536), which the GPU
benchmarks (Llama/Qwen shapes) never ran: the batch-1 products (o_proj, qkv with rotary and the
KV store, gate_up with SiLU), decode attention and the speculative verify's tree-masked extend.
Under Triton's interpreter on CPU; compiled on the GPU."""
from __future__ import annotations

import torch

from sgdsl.runtime.kernels.extend_attention import extend_attention_fwd
from sgdsl.runtime.kernels.gemv import gemv
from sgdsl.runtime.kernels.gemv_pairs import gemv_silu
from sgdsl.runtime.speculative.base import DraftTree
from sgdsl.runtime.speculative.verify_batch import TreeMask

from .conftest import ON_GPU, rel_err, tol
from .paged import scattered_pool
from .test_decode_attention import _run as decode_case
from .test_extend_tree_mask import _ref as tree_ref
from .test_gemv_pairs import _rope_case, _silu_ref

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP = 576, 9, 3, 64, 1536
# the default tiles on the GPU; on CPU 16 rows (pairs) a program, so the interpreter runs
# 16x fewer programs (the K loop, whose tail is masked at 576, is the same)
TILE = None if ON_GPU else (16, 2048, 4)


def test_gemv_o_proj(device, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, HEADS * HEAD_DIM, generator=gen).to(dtype).to(device)
    w = (torch.randn(HIDDEN, HEADS * HEAD_DIM, generator=gen) * HIDDEN ** -0.5).to(dtype).to(device)
    assert rel_err(gemv(x, w, None, TILE), x.double() @ w.double().T) < tol(dtype)


def test_gemv_rope_qkv_and_kv_store(device, dtype):
    _rope_case(device, dtype, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, TILE, seed=3)


def test_gemv_silu_gate_up(device, dtype):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, HIDDEN, generator=gen).to(dtype).to(device)
    w = (torch.randn(2 * MLP, HIDDEN, generator=gen) * HIDDEN ** -0.5).to(dtype).to(device)
    assert rel_err(gemv_silu(x, w, None, TILE), _silu_ref(x, w)) < tol(dtype)


def test_decode_attention(device, dtype):
    decode_case([1, 45, 300], heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, max_splits=4,
                min_per_split=64, device=device, dtype=dtype, seed=5)


def test_verify_extend_chain_and_tree(device, dtype):
    trees = [DraftTree.chain([1, 2, 3, 4]), DraftTree((5, 9, 6, 7), (-1, -1, 0, 2))]
    prefix_lens, extend_lens = [40, 9], [len(t) + 1 for t in trees]
    gen = torch.Generator().manual_seed(6)
    k_buf, v_buf, r2t, rows = scattered_pool(prefix_lens, KV_HEADS, HEAD_DIM, dtype, device, gen)
    q, k, v = (torch.randn(sum(extend_lens), h, HEAD_DIM, generator=gen).to(dtype).to(device)
               for h in (HEADS, KV_HEADS, KV_HEADS))
    out = torch.full_like(q, float("nan"))
    start = torch.tensor([0] + extend_lens[:-1], device=device).cumsum(0)
    mask, scale = TreeMask.build(trees, torch.device(device)), HEAD_DIM ** -0.5
    extend_attention_fwd(q, k, v, out, k_buf, v_buf, r2t, rows,
                         torch.tensor(prefix_lens, device=device),
                         torch.tensor(extend_lens, device=device), start, max(extend_lens),
                         scale, custom_mask=mask.flat, mask_starts=mask.starts)
    for i, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        s, slots = int(start[i]), r2t[rows[i], :p]
        allowed = torch.cat([torch.ones(e, p, dtype=torch.bool, device=device),
                             mask.masks[i]], dim=1)
        ref = tree_ref(q[s:s + e], torch.cat([k_buf[slots], k[s:s + e]]),
                       torch.cat([v_buf[slots], v[s:s + e]]), allowed, scale)
        assert rel_err(out[s:s + e], ref) < tol(dtype), f"request {i}"

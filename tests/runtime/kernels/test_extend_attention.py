"""Extend attention (pool prefix + causal new tokens) vs a float64 torch reference."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.extend_attention import extend_attention_fwd

from .conftest import rel_err, tol
from .paged import ref_attention, scattered_pool


def _run(prefix_lens, extend_lens, heads, kv_heads, head_dim, device, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    k_buf, v_buf, r2t, rows = scattered_pool([max(p, 1) for p in prefix_lens], kv_heads,
                                             head_dim, dtype, device, gen)
    total = sum(extend_lens)
    q = torch.randn(total, heads, head_dim, generator=gen).to(dtype).to(device)
    k = torch.randn(total, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    v = torch.randn(total, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    out = torch.full_like(q, float("nan"))
    start = torch.tensor([0] + extend_lens[:-1], device=device).cumsum(0)
    scale = head_dim ** -0.5
    extend_attention_fwd(q, k, v, out, k_buf, v_buf, r2t, rows,
                         torch.tensor(prefix_lens, device=device),
                         torch.tensor(extend_lens, device=device), start, max(extend_lens), scale)
    for i, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        s = int(start[i])
        slots = r2t[rows[i], :p]
        keys = torch.cat([k_buf[slots], k[s:s + e]])
        vals = torch.cat([v_buf[slots], v[s:s + e]])
        ref = ref_attention(q[s:s + e], keys, vals, p, scale)
        assert rel_err(out[s:s + e], ref) < tol(dtype), f"request {i} (prefix {p}, new {e})"


def test_prefix_and_causal_gqa(device, dtype):
    # Mixed: no prefix, short prefix, prefix longer than the new part; lengths not multiples
    # of the 16-row blocks; group 3.
    _run([0, 5, 40], [21, 1, 18], heads=6, kv_heads=2, head_dim=40, device=device,
         dtype=dtype, seed=0)


def test_pure_prefill_mha(device, dtype):
    _run([0, 0], [33, 7], heads=2, kv_heads=2, head_dim=16, device=device, dtype=dtype, seed=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_llama8b_shape_chunked():
    _run([0, 2048, 130, 777], [1024, 128, 300, 1], heads=32, kv_heads=8, head_dim=128,
         device="cuda", dtype=torch.bfloat16, seed=2)

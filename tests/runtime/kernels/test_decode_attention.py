"""Split-K decode attention vs a float64 torch reference over a scattered paged pool."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.decode_attention import decode_attention_fwd, num_kv_splits_for

from .conftest import rel_err, tol
from .paged import ref_attention, scattered_pool


def _run(seq_lens, heads, kv_heads, head_dim, max_splits, min_per_split, device, dtype, seed,
         scratch_splits=None, block_n=32, splits_in_kernel=False):
    """``splits_in_kernel``: no split-count tensor, stage 1 computes it (as the backend runs)."""
    gen = torch.Generator().manual_seed(seed)
    k_buf, v_buf, r2t, rows = scattered_pool(seq_lens, kv_heads, head_dim, dtype, device, gen)
    bs = len(seq_lens)
    q = torch.randn(bs, heads, head_dim, generator=gen).to(dtype).to(device)
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    sl = torch.tensor(seq_lens, device=device)
    splits = num_kv_splits_for(sl, max_splits, min_per_split)
    width = scratch_splits or max_splits
    mid_o = torch.full((bs, heads, width, head_dim), float("nan"), device=device)
    mid_lse = torch.full((bs, heads, width), float("nan"), device=device)
    scale = head_dim ** -0.5
    decode_attention_fwd(q, k_buf, v_buf, out, r2t, rows, sl,
                         None if splits_in_kernel else splits, mid_o, mid_lse, scale,
                         max_splits, block_n=block_n, min_tokens_per_split=min_per_split)
    for i, n in enumerate(seq_lens):
        slots = r2t[rows[i], :n]
        ref = ref_attention(q[i:i + 1], k_buf[slots], v_buf[slots], n - 1, scale)
        assert rel_err(out[i:i + 1], ref) < tol(dtype), f"request {i} (len {n})"
    return splits


@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_gqa_split_k_non_power_of_two(device, dtype, block_n):
    # group 3 (SmolLM2's 9/3), head_dim 48, lengths that are not multiples of any block.
    splits = _run([1, 37, 70, 5], heads=9, kv_heads=3, head_dim=48, max_splits=4,
                  min_per_split=16, device=device, dtype=dtype, seed=0, block_n=block_n)
    assert splits.tolist() == [1, 3, 4, 1]  # the long requests really are split


@pytest.mark.parametrize("lens,max_splits,min_per_split", [
    ([1, 37, 70, 5], 4, 16), ([2, 3], 8, 1), ([45, 9], 2, 8), ([19, 3], 1, 256)])
def test_splits_counted_in_kernel(device, dtype, lens, max_splits, min_per_split):
    # num_kv_splits None: the kernel's count from each length is num_kv_splits_for's
    _run(lens, heads=4, kv_heads=2, head_dim=16, max_splits=max_splits,
         min_per_split=min_per_split, device=device, dtype=dtype, seed=5, scratch_splits=16,
         splits_in_kernel=True)


def test_mha_single_split(device, dtype):
    _run([19, 3], heads=2, kv_heads=2, head_dim=32, max_splits=1, min_per_split=256,
         device=device, dtype=dtype, seed=1)


def test_splits_beyond_length(device, dtype):
    # More splits than tokens: empty splits must contribute nothing (and not NaN).
    _run([2, 3], heads=4, kv_heads=1, head_dim=16, max_splits=8, min_per_split=1,
         device=device, dtype=dtype, seed=2)


def test_launch_narrower_than_scratch(device, dtype):
    # The backend caps splits per batch size below the scratch width (poisoned with NaN).
    splits = _run([45, 9], heads=4, kv_heads=2, head_dim=16, max_splits=2, min_per_split=8,
                  device=device, dtype=dtype, seed=4, scratch_splits=16)
    assert splits.tolist() == [2, 2]


def test_launcher_rejects_bad_shapes(device):
    q = torch.zeros(1, 3, 16, device=device)
    kv = torch.zeros(4, 2, 16, device=device)
    r2t = torch.zeros(1, 4, dtype=torch.int64, device=device)
    one = torch.ones(1, dtype=torch.int64, device=device)
    mid_o = torch.zeros(1, 3, 2, 16, device=device)
    mid_lse = torch.zeros(1, 3, 2, device=device)
    with pytest.raises(AssertionError, match="multiple"):
        decode_attention_fwd(q, kv, kv, q.clone(), r2t, one - 1, one, one.int(), mid_o, mid_lse, 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("splits_in_kernel", [False, True])
def test_gpu_llama8b_shape_long_context(splits_in_kernel):
    _run([1000, 4097, 33, 2500], heads=32, kv_heads=8, head_dim=128, max_splits=16,
         min_per_split=256, device="cuda", dtype=torch.bfloat16, seed=3,
         splits_in_kernel=splits_in_kernel)

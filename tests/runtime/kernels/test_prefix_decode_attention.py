"""Cascade decode attention (suffix split-K from ``starts`` + shared-prefix tiles + one merge)
vs a float64 torch reference over each request's whole paged sequence."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.decode_attention import decode_merge, decode_stage1, num_kv_splits_for
from sgdsl.runtime.kernels.prefix_decode_attention import (prefix_block_members,
                                                           prefix_decode_attention)

from .conftest import rel_err, tol
from .paged import ref_attention


def _cascade(groups, solo, heads, kv_heads, head_dim, splits, device, dtype, seed,
             splits_in_kernel=False):
    """``groups``: (prefix_len, [suffix lens]) per group; ``solo``: lengths without a group.
    ``splits_in_kernel``: stage 1 counts each suffix's splits itself (as the backend runs it)."""
    gen = torch.Generator().manual_seed(seed)
    block_m = prefix_block_members(heads, kv_heads)
    lens, prefixes, rows_of_group = [], [], []
    for p, suffixes in groups:
        rows_of_group.append(list(range(len(lens), len(lens) + len(suffixes))))
        lens += [p + s for s in suffixes]
        prefixes += [p] * len(suffixes)
    lens += solo
    prefixes += [0] * len(solo)
    bs, total = len(lens), sum(lens) + 1
    k_buf = torch.randn(total, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    v_buf = torch.randn(total, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    perm = torch.randperm(total - 1, generator=gen) + 1
    r2t = torch.zeros(bs + 3, max(lens) + 4, dtype=torch.int64)
    req_rows = torch.randperm(bs + 3, generator=gen)[:bs]
    used = 0
    for (p, _), members in zip(groups, rows_of_group):  # one prefix copy per group
        shared = perm[used:used + p]
        used += p
        for i in members:
            r2t[req_rows[i], :p] = shared
    for i, n in enumerate(lens):
        own = n - prefixes[i]
        r2t[req_rows[i], prefixes[i]:n] = perm[used:used + own]
        used += own
    tiles = []
    for (p, _), members in zip(groups, rows_of_group):
        for j in range(0, len(members), block_m):
            chunk = members[j:j + block_m]
            tiles.append((int(req_rows[chunk[0]]), p, chunk + [-1] * (block_m - len(chunk))))
    tiles.append((0, 0, [-1] * block_m))  # an empty (padding) tile
    dev = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
    tile_rows, tile_lens = dev([t[0] for t in tiles]), dev([t[1] for t in tiles])
    tile_members = dev([t[2] for t in tiles])
    q = torch.randn(bs, heads, head_dim, generator=gen).to(dtype).to(device)
    out = torch.full_like(q, float("nan"))
    r2t, rows, sl, starts = r2t.to(device), req_rows.to(device), dev(lens), dev(prefixes)
    mid_o = torch.full((bs, heads, 2 * splits, head_dim), float("nan"), device=device)
    mid_lse = torch.full((bs, heads, 2 * splits), float("nan"), device=device)
    scale = head_dim ** -0.5
    nsplit = None if splits_in_kernel else num_kv_splits_for(sl - starts, splits, 8)
    decode_stage1(q, k_buf, v_buf, r2t, rows, sl, nsplit, mid_o, mid_lse, scale, splits, starts,
                  min_tokens_per_split=8)
    mid_lse[:, :, splits:].fill_(float("-inf"))
    prefix_decode_attention(q, k_buf, v_buf, r2t, tile_rows, tile_lens, tile_members, mid_o,
                            mid_lse, scale, splits, splits)
    decode_merge(mid_o, mid_lse, out, 2 * splits)
    for i, n in enumerate(lens):
        slots = r2t[rows[i], :n]
        ref = ref_attention(q[i:i + 1], k_buf[slots], v_buf[slots], n - 1, scale)
        assert rel_err(out[i:i + 1], ref) < tol(dtype), f"request {i} (len {n})"


@pytest.mark.parametrize("splits_in_kernel", [False, True])
def test_groups_tiles_and_solo_requests(device, dtype, splits_in_kernel):
    # group 3 (9 heads / 3 KV heads: 16 members a tile), head_dim 48; the 18-member group
    # spans two tiles; odd lengths everywhere; two requests in no group (their prefix split
    # slots stay NaN: the merge must drop them, not multiply them by 0).
    _cascade([(37, [1, 5, 9]), (70, [3] * 18), (5, [2, 2])], solo=[1, 29], heads=9,
             kv_heads=3, head_dim=48, splits=2, device=device, dtype=dtype, seed=0,
             splits_in_kernel=splits_in_kernel)


def test_single_split_mha(device, dtype):
    _cascade([(19, [1, 4])], solo=[7], heads=2, kv_heads=2, head_dim=32, splits=1,
             device=device, dtype=dtype, seed=1)


def test_block_members_keeps_tiles_dot_sized():
    assert prefix_block_members(32, 8) == 16  # Llama-3.1-8B: 16 requests x 4 heads
    assert prefix_block_members(14, 2) == 8  # Qwen2.5-0.5B: group 7 -> 8 rows each
    assert prefix_block_members(64, 1) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_llama8b_shape_shared_system_prompt():
    _cascade([(2048, [128 + i for i in range(16)]), (1000, [5, 300])], solo=[2200, 1],
             heads=32, kv_heads=8, head_dim=128, splits=4, device="cuda",
             dtype=torch.bfloat16, seed=3)

"""Decode attention over a prefix shared by several requests, reading its KV once per group.

A decode batch where groups of requests share a cached prefix (same KV slots, e.g. one system
prompt) reads that prefix's K/V once per request in plain split-K decode. Here one program
takes a *tile*: up to ``block_members`` requests of one group, all query heads of one KV head
(``members x group`` rows, one ``tl.dot`` per K/V block), so the prefix is read once per tile.
It writes split partials (unnormalized output + log-sum-exp) into the same scratch as decode
stage 1, at split slots ``[split_offset, split_offset + num_splits)``; stage 2 then merges the
prefix and the per-request suffix partials (cascade attention).

Tiles come from the host (``layers/attention/shared_prefix.py``): ``tile_rows[t]`` is a
``req_to_token`` row holding the prefix, ``tile_lens[t]`` its length (0: empty tile) and
``tile_members[t, :]`` batch indices (-1: padding). Launch shapes depend only on the tile
count, so the kernel can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .online_softmax import attend_block, split_partial

# NOTE: rows per program = members x next_pow2(query heads per KV head), capped so the
# accumulator stays in registers; at least 16 rows for tl.dot.
MAX_TILE_ROWS = 64


def prefix_block_members(num_heads: int, kv_heads: int) -> int:
    """Requests per tile for a model's GQA grouping."""
    return max(2, MAX_TILE_ROWS // triton.next_power_of_2(num_heads // kv_heads))


@triton.jit
def _prefix_stage1(
    Q, K_Buf, V_Buf, Req_to_token, Tile_rows, Tile_lens, Tile_members, Mid_o, Mid_lse,
    sm_scale, v_scale,
    stride_qb, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_rt,
    stride_mob, stride_moh, stride_mos, stride_lb, stride_lh, split_offset,
    KV_GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split_id = tl.program_id(2)

    offs_r = tl.arange(0, BLOCK_M * BLOCK_G)
    member = tl.load(Tile_members + tile * BLOCK_M + offs_r // BLOCK_G)
    g = offs_r % BLOCK_G
    valid = (member >= 0) & (g < KV_GROUP)
    member = tl.where(valid, member, 0).to(tl.int64)
    head = kv_head * KV_GROUP + g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    plen = tl.load(Tile_lens + tile).to(tl.int32)
    row = tl.load(Tile_rows + tile).to(tl.int64)
    per_split = tl.cdiv(plen, NUM_SPLITS)
    start = per_split * split_id
    end = tl.minimum(start + per_split, plen)

    q = tl.load(Q + member[:, None] * stride_qb + head[:, None] * stride_qh + offs_d[None, :],
                mask=valid[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        m_i, l_i, acc = attend_block(
            q, K_Buf, V_Buf, Req_to_token, row, stride_rt, kv_head, stride_kbs, stride_kh,
            stride_vbs, stride_vh, n0 + tl.arange(0, BLOCK_N), end, valid, offs_d, mask_d, m_i,
            l_i, acc, sm_scale, PRECISION)

    out, lse = split_partial(m_i, l_i, acc, v_scale)
    split = split_offset + split_id
    tl.store(Mid_o + member[:, None] * stride_mob + head[:, None] * stride_moh
             + split * stride_mos + offs_d[None, :], out, mask=valid[:, None] & mask_d[None, :])
    tl.store(Mid_lse + member * stride_lb + head * stride_lh + split, lse, mask=valid)


def prefix_decode_attention(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
    tile_rows: torch.Tensor, tile_lens: torch.Tensor, tile_members: torch.Tensor,
    mid_o: torch.Tensor, mid_lse: torch.Tensor, sm_scale: float, split_offset: int,
    num_splits: int, k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """Partials of every tile member's attention over its group's shared prefix.

    NOTE: rows of requests in no tile are left untouched: the caller sets their
    ``mid_lse[..., split_offset:split_offset + num_splits]`` to -inf (stage 2 weight 0)."""
    bs, num_heads, head_dim = q.shape
    kv_heads = k_buf.shape[1]
    tiles, block_m = tile_members.shape
    assert tile_rows.shape == tile_lens.shape == (tiles,), "one row and length per tile"
    assert tile_members.stride(1) == 1 and tile_members.stride(0) == block_m
    assert num_heads % kv_heads == 0 and q.stride(2) == 1 and k_buf.stride(2) == 1
    assert split_offset + num_splits <= mid_lse.shape[2], "prefix splits exceed the scratch"
    assert mid_o.shape[:2] == (bs, num_heads) and mid_o.stride(3) == 1 and mid_lse.stride(2) == 1
    group = num_heads // kv_heads
    block_g = triton.next_power_of_2(group)
    assert block_m * block_g >= 16, "tl.dot needs at least 16 rows"
    if tiles == 0:
        return
    _prefix_stage1[(tiles, kv_heads, num_splits)](
        q, k_buf, v_buf, req_to_token, tile_rows, tile_lens, tile_members, mid_o, mid_lse,
        sm_scale * k_scale, v_scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), v_buf.stride(0),
        v_buf.stride(1), req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        split_offset,
        KV_GROUP=group, BLOCK_G=block_g, BLOCK_M=block_m, BLOCK_N=32,
        BLOCK_D=triton.next_power_of_2(head_dim), HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4, num_stages=2,
    )

"""SharedPrefix: cascade-decode metadata for a decode batch whose requests share cached prefixes.

The scheduler knows which running requests share a prefix (the radix tree's nodes); it passes
groups as (``req_to_token`` row holding the prefix, prefix length, batch indices of the members).
``build_shared_prefix`` turns them into fixed-shape tensors: per request the length of its
shared prefix (0: none; the suffix kernel starts there), and *tiles* of up to ``block_members``
requests of one group for ``kernels/prefix_decode_attention.py``. The tile count depends only
on the batch size (every group has >= 2 members, so at most bs // 2 tiles, capped at
``MAX_TILES``), which keeps the shapes CUDA-graph friendly. Groups that do not fit (the largest
savings go first) simply read their prefix per request. Backends without cascade support ignore
it: it never changes results.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..upload import to_device


@dataclass(frozen=True)
class SharedPrefix:
    prefix_lens: torch.Tensor  # [bs] int64: tokens of each request covered by its group's tile
    tile_rows: torch.Tensor  # [T] int64: req_to_token row holding the group's prefix
    tile_lens: torch.Tensor  # [T] int64: prefix length; 0 marks an empty tile
    tile_members: torch.Tensor  # [T, block_members] int64: batch indices, -1 padding


# NOTE: graphs launch this many tile programs per KV head and split even when nothing is shared
# (they exit at once); 32 tiles of 16 requests cover a batch of 512 in one group per tile.
MAX_TILES = 32


def max_tiles(bs: int) -> int:
    return min(max(bs // 2, 1), MAX_TILES)


def build_shared_prefix(groups: list[tuple[int, int, list[int]]], bs: int,
                        block_members: int, device: torch.device) -> SharedPrefix:
    """Tensors for ``groups`` of (row, prefix_len, member batch indices) in a batch of ``bs``."""
    t = max_tiles(bs)
    prefix_lens = torch.zeros(bs, dtype=torch.int64)
    rows = torch.zeros(t, dtype=torch.int64)
    lens = torch.zeros(t, dtype=torch.int64)
    members = torch.full((t, block_members), -1, dtype=torch.int64)
    i = 0
    for row, plen, batch_idx in sorted(groups, key=lambda g: -g[1] * len(g[2])):
        assert len(batch_idx) >= 2 and plen > 0, "a group shares a prefix between >= 2 requests"
        need = -(-len(batch_idx) // block_members)
        if i + need > t:
            continue  # no tiles left: this group reads its prefix per request
        prefix_lens[batch_idx] = plen
        for j in range(0, len(batch_idx), block_members):
            chunk = batch_idx[j:j + block_members]
            rows[i], lens[i] = row, plen
            members[i, :len(chunk)] = torch.tensor(chunk, dtype=torch.int64)
            i += 1
    return SharedPrefix(*(to_device(t, device) for t in (prefix_lens, rows, lens, members)))

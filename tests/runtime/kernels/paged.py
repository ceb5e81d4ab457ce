"""Shared helpers: a scattered paged KV layout and the torch reference attention over it."""
from __future__ import annotations

import torch


def scattered_pool(seq_lens: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype,
                   device: str, gen: torch.Generator, extra_slots: int = 7):
    """K/V buffers with random contents and a req_to_token table whose rows point at a random
    permutation of slots (so a kernel that ignores the indirection fails). Request i uses row
    perm_rows[i], not row i, for the same reason."""
    total = sum(seq_lens) + extra_slots + 1
    k_buf = torch.randn(total, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    v_buf = torch.randn(total, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    slots = torch.randperm(total - 1, generator=gen)[: sum(seq_lens)] + 1
    rows = len(seq_lens) + 2
    max_len = max(seq_lens) + 5
    req_to_token = torch.zeros(rows, max_len, dtype=torch.int64)
    req_rows = torch.randperm(rows, generator=gen)[: len(seq_lens)]
    off = 0
    for i, n in enumerate(seq_lens):
        req_to_token[req_rows[i], :n] = slots[off:off + n]
        off += n
    return k_buf, v_buf, req_to_token.to(device), req_rows.to(device)


def ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int,
                  scale: float) -> torch.Tensor:
    """q [M, H, D] at positions q_offset.., k/v [N, KVH, D]; causal; float64 result."""
    h, kvh = q.shape[1], k.shape[1]
    k = k.double().repeat_interleave(h // kvh, dim=1)
    v = v.double().repeat_interleave(h // kvh, dim=1)
    s = torch.einsum("mhd,nhd->hmn", q.double(), k) * scale
    m_pos = torch.arange(q.shape[0], device=q.device)[:, None] + q_offset
    n_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    s = s.masked_fill(n_pos > m_pos, float("-inf"))
    return torch.einsum("hmn,nhd->mhd", s.softmax(-1), v)

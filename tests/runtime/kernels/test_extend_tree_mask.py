"""spec: the extend kernel's draft-tree mask (speculative verify): each new token attends to
the pool prefix and to the new tokens its tree mask allows, vs a float64 torch reference."""
from __future__ import annotations

import torch

from sgdsl.runtime.kernels.extend_attention import extend_attention_fwd
from sgdsl.runtime.speculative.base import DraftTree
from sgdsl.runtime.speculative.verify_batch import TreeMask

from .conftest import rel_err, tol
from .paged import scattered_pool


def _ref(q, keys, vals, allowed, scale):
    h, kvh = q.shape[1], keys.shape[1]
    k = keys.double().repeat_interleave(h // kvh, dim=1)
    v = vals.double().repeat_interleave(h // kvh, dim=1)
    s = torch.einsum("mhd,nhd->hmn", q.double(), k) * scale
    s = s.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hmn,nhd->mhd", s.softmax(-1), v)


def test_tree_mask_rows_see_prefix_and_ancestors(device, dtype):
    trees = [DraftTree((5, 9, 6, 7, 8), (-1, -1, 0, 0, 2)), DraftTree.chain([1, 2]),
             DraftTree((3, 4, 5), (-1, -1, -1))]
    prefix_lens = [7, 20, 3]
    extend_lens = [len(t) + 1 for t in trees]
    heads, kv_heads, head_dim = 4, 2, 16
    gen = torch.Generator().manual_seed(0)
    k_buf, v_buf, r2t, rows = scattered_pool(prefix_lens, kv_heads, head_dim, dtype, device, gen)
    total = sum(extend_lens)
    q, k, v = (torch.randn(total, h, head_dim, generator=gen).to(dtype).to(device)
               for h in (heads, kv_heads, kv_heads))
    out = torch.full_like(q, float("nan"))
    start = torch.tensor([0] + extend_lens[:-1], device=device).cumsum(0)
    mask = TreeMask.build(trees, torch.device(device))
    scale = head_dim ** -0.5
    extend_attention_fwd(q, k, v, out, k_buf, v_buf, r2t, rows,
                         torch.tensor(prefix_lens, device=device),
                         torch.tensor(extend_lens, device=device), start, max(extend_lens),
                         scale, custom_mask=mask.flat, mask_starts=mask.starts)
    for i, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        s = int(start[i])
        slots = r2t[rows[i], :p]
        allowed = torch.cat([torch.ones(e, p, dtype=torch.bool, device=device),
                             mask.masks[i]], dim=1)
        ref = _ref(q[s:s + e], torch.cat([k_buf[slots], k[s:s + e]]),
                   torch.cat([v_buf[slots], v[s:s + e]]), allowed, scale)
        assert rel_err(out[s:s + e], ref) < tol(dtype), f"request {i}"

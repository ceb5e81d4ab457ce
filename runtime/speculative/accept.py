"""Accepting draft tokens: walk each tree along the target's own samples, then keep the KV of
the accepted path and free the rest.

Acceptance is sample-and-compare: the target samples one token at the root and at every node
(with the request's own sampler: temperature, top-k/p, min-p, penalties, grammar mask, its
seed at that output step); the walk descends while the sampled token is a child's draft token.
For point-mass drafts this is exactly rejection sampling: the draft token x is accepted with
probability p(x), and on rejection the emitted token is distributed as p with x zeroed and
renormalised (p conditioned on not being x). Greedy rows take the argmax, so the accepted path
is the longest one greedy agrees with. Either way every emitted token is distributed exactly as
the non-speculative sampler's; with a seed it is even the same token (same noise per step).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ..scheduler.sample_step import token_logprobs
from .base import DraftTree, ROOT


def walk(tree: DraftTree, sampled: Sequence[int]) -> tuple[list[int], list[int]]:
    """``sampled[0]``: the root's sample, ``sampled[1 + j]``: node j's. Returns the accepted
    nodes (root to deepest) and the emitted tokens (theirs, then the bonus sample)."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    path: list[int] = []
    node = ROOT
    while True:
        token = sampled[node + 1]
        nxt = next((c for c in children.get(node, ()) if tree.tokens[c] == token), None)
        if nxt is None:
            return path, [tree.tokens[i] for i in path] + [token]
        path.append(nxt)
        node = nxt


def row_of_emitted(first: int, path: list[int]) -> list[int]:
    """Logits row that scores each emitted token: the root's, then each accepted node's."""
    return [first] + [first + 1 + i for i in path]


def commit_kv(memory: Any, req: Any, kv_len: int, n_nodes: int, path: list[int],
              slots: torch.Tensor) -> None:
    """Keep the KV of the root and the accepted nodes at columns ``kv_len ..`` (in path order)
    and free the other nodes' slots. ``slots``: the request's reserved slots, root first."""
    keep = [0] + [1 + i for i in path]
    moved = [j for j, node in enumerate(keep) if node != j]
    if moved:  # a tree: accepted nodes move up to the columns right after the root
        row = req.req_pool_idx
        cols = torch.tensor([kv_len + j for j in moved], dtype=torch.int64)
        new = slots[torch.tensor([keep[j] for j in moved])]
        memory.host_table[row, cols] = new
        dev = memory.device
        memory.write_table(torch.full((len(moved),), row, device=dev), cols.to(dev), new.to(dev))
    kept = set(keep)
    drop = [i for i in range(n_nodes + 1) if i not in kept]
    if drop:
        memory.kv_pool.free(slots[torch.tensor(drop)])
    req.kv_len = kv_len + len(keep)


def record_logprobs(req: Any, logits: torch.Tensor, rows: list[int], tokens: list[int]) -> None:
    """Output logprobs of the emitted tokens (raw logits rows, as the decode step records)."""
    dev = logits.device
    picked, tops = token_logprobs(logits.index_select(0, torch.tensor(rows, device=dev)),
                                  torch.tensor(tokens, device=dev), req.top_logprobs_num)
    k = req.top_logprobs_num
    for j, token in enumerate(tokens):
        req.output_token_logprobs.append((picked[j], token))
        req.output_top_logprobs.append(tops[j][:k] if tops and k else [])

"""The target forward of a verify step: every request feeds its last verified token (the
tree's root, whose KV is not written yet) and its draft nodes, and gets logits for each.

Row ``j`` of a request is written at KV column ``kv_len + j`` (root first, then the nodes in
tree order) and sits at position ``kv_len + depth`` (the root at depth 0). Two shapes:

- every draft is a chain: a DECODE batch with one row per fed token (the rows of one request
  share its ``req_to_token`` row, with lengths growing by one, so each row attends to the KV up
  to its own token: all of a layer's KV is stored before its attention runs). The CPU decoder
  and the decode CUDA graphs run it unchanged; it is also what the grammar's jump-forward rows
  do (``RunningBatch.mixed_batch``).
- some draft branches: a TARGET_VERIFY extend whose new tokens attend to the prefix and to
  their tree ancestors only (``TreeMask`` in ``ForwardBatch.spec_info``, read by the attention
  backends).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..layers.upload import to_device
from ..model.forward_batch import ForwardBatch, ForwardMode
from .base import DraftTree


@dataclass
class TreeMask:
    """Per request, ``[n + 1, n + 1]`` bool (root first): query row may attend to key column
    among the request's new tokens; every new token also attends to the whole prefix.
    ``flat``/``starts``: the same masks concatenated (row-major), for kernels."""

    masks: list[torch.Tensor]
    flat: torch.Tensor
    starts: torch.Tensor

    @classmethod
    def build(cls, trees: Sequence[DraftTree], device: torch.device) -> "TreeMask":
        masks, starts, at = [], [], 0
        for tree in trees:
            anc = tree.ancestor_mask()
            n = len(tree) + 1
            rows = [[True] + [False] * (n - 1)]
            rows += [[True] + r for r in anc]
            masks.append(torch.tensor(rows, dtype=torch.bool))
            starts.append(at)
            at += n * n
        flat = torch.cat([m.view(-1) for m in masks]) if masks else torch.empty(0, dtype=torch.bool)
        return cls([to_device(m, device) for m in masks], to_device(flat, device),
                   to_device(torch.tensor(starts, dtype=torch.int64), device))


@dataclass
class VerifyLayout:
    """Where each request's rows landed: ``first[i]`` is its root row; ``kv_lens[i]`` the
    KV column of its root; ``slots`` the KV slot of every row (host)."""

    first: list[int]
    kv_lens: list[int]
    slots: torch.Tensor

    def rows(self, i: int, tree: DraftTree) -> range:
        return range(self.first[i], self.first[i] + len(tree) + 1)


def build_verify(reqs: Sequence[Any], trees: Sequence[DraftTree], memory: Any,
                 device: torch.device) -> tuple[ForwardBatch, VerifyLayout] | None:
    """Reserve KV slots for every fed token and build the forward; None if KV ran short
    (nothing reserved then)."""
    rows, cols, ids, pos, first = [], [], [], [], []
    for req, tree in zip(reqs, trees):
        p = req.kv_len
        first.append(len(cols))
        rows.extend([req.req_pool_idx] * (len(tree) + 1))
        cols.extend(range(p, p + len(tree) + 1))
        ids.append(req.all_ids[-1])
        ids.extend(tree.tokens)
        pos.append(p)
        pos.extend(p + d for d in tree.depths)
    slots = memory.reserve_at(torch.tensor(rows), torch.tensor(cols))
    if slots is None:
        return None
    total = len(cols)
    index = torch.tensor(rows + cols + slots.tolist() + ids + pos)
    rows_d, cols_d, slots_d, ids_d, pos_d = to_device(index, device).split([total] * 5)
    memory.write_table(rows_d, cols_d, slots_d)
    layout = VerifyLayout(first, [r.kv_len for r in reqs], slots)
    if all(t.is_chain for t in trees):
        batch = _rows_batch(rows_d, cols_d, slots_d, ids_d, cols, device)
    else:
        batch = _tree_batch(reqs, trees, rows_d, slots_d, ids_d, pos_d, device)
    return batch, layout


def _rows_batch(rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor,
                ids: torch.Tensor, cols_host: list[int], device: torch.device) -> ForwardBatch:
    """Chains: one decode row per fed token (position == column)."""
    total = len(cols_host)
    ones = torch.ones(total, dtype=torch.int64, device=device)
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=total, input_ids=ids, positions=cols,
        req_pool_indices=rows, seq_lens=cols + 1, out_cache_loc=slots,
        extend_prefix_lens=cols, extend_seq_lens=ones,
        extend_start_loc=torch.arange(total, dtype=torch.int64, device=device),
        seq_lens_cpu=[c + 1 for c in cols_host], extend_prefix_lens_cpu=list(cols_host),
        extend_seq_lens_cpu=[1] * total)


def _tree_batch(reqs: Sequence[Any], trees: Sequence[DraftTree], rows: torch.Tensor,
                slots: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor,
                device: torch.device) -> ForwardBatch:
    """Trees: an extend of ``n + 1`` tokens per request on top of its KV, tree-masked."""
    prefix = [r.kv_len for r in reqs]
    lens = [len(t) + 1 for t in trees]
    starts = [sum(lens[:i]) for i in range(len(lens))]
    dev = lambda v: to_device(torch.tensor(v, dtype=torch.int64), device)  # noqa: E731
    total = sum(lens)
    return ForwardBatch(
        mode=ForwardMode.TARGET_VERIFY, batch_size=len(reqs), input_ids=ids, positions=pos,
        req_pool_indices=rows.index_select(0, dev(starts)),
        seq_lens=dev([p + n for p, n in zip(prefix, lens)]), out_cache_loc=slots,
        extend_prefix_lens=dev(prefix), extend_seq_lens=dev(lens), extend_start_loc=dev(starts),
        logits_indices=torch.arange(total, dtype=torch.int64, device=device),
        seq_lens_cpu=[p + n for p, n in zip(prefix, lens)], extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=lens, spec_info=TreeMask.build(trees, device))

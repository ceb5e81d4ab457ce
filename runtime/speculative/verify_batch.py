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
    """Per request, ``[f + n, f + n]`` bool over its new tokens (``f`` fed tokens, causal, the
    last one the tree's root, then the ``n`` nodes, each seeing the fed tokens and its
    ancestors); every new token also attends to the whole prefix. ``flat``/``starts``: the
    same masks concatenated (row-major), for kernels."""

    masks: list[torch.Tensor]
    flat: torch.Tensor
    starts: torch.Tensor

    @classmethod
    def build(cls, trees: Sequence[DraftTree], device: torch.device,
              fed: Sequence[int] | None = None) -> "TreeMask":
        masks, starts, at = [], [], 0
        for i, tree in enumerate(trees):
            f = fed[i] if fed is not None else 1
            size = f + len(tree)
            mask = torch.zeros(size, size, dtype=torch.bool)
            mask[:f, :f] = torch.ones(f, f, dtype=torch.bool).tril()
            mask[f:, :f] = True
            if len(tree):
                mask[f:, f:] = torch.tensor(tree.ancestor_mask(), dtype=torch.bool)
            masks.append(mask)
            starts.append(at)
            at += size * size
        flat = torch.cat([m.view(-1) for m in masks]) if masks else torch.empty(0, dtype=torch.bool)
        return cls([to_device(m, device) for m in masks], to_device(flat, device),
                   to_device(torch.tensor(starts, dtype=torch.int64), device))


@dataclass
class VerifyLayout:
    """Where each request's rows landed: ``first[i]`` is its root row (after any other fed
    tokens: jump-forward tokens without KV); ``kv_lens[i]`` the KV column of its root; ``slots``
    the KV slot of every row (host); ``verify_rows`` the rows of every root and node, in
    order (the rows sampled), and ``compact[i]`` where request i's root is among them."""

    first: list[int]
    kv_lens: list[int]
    slots: torch.Tensor
    verify_rows: list[int]
    compact: list[int]

    @property
    def fed_extra(self) -> bool:
        return len(self.verify_rows) != int(self.slots.numel())


def build_verify(reqs: Sequence[Any], trees: Sequence[DraftTree], memory: Any,
                 device: torch.device) -> tuple[ForwardBatch, VerifyLayout] | None:
    """Reserve KV slots for every fed token and build the forward; None if KV ran short
    (nothing reserved then). Each request feeds ``all_ids[kv_len:]`` (its last token, or
    jump-forward tokens and the last) and then its draft nodes."""
    return build_verify_at([feed_of(r) for r in reqs], trees, memory, device)


def feed_of(req: Any) -> tuple[int, int, tuple[int, ...]]:
    """(its ``req_to_token`` row, its KV length, the tokens it feeds: ``all_ids[kv_len:]``)."""
    return req.req_pool_idx, req.kv_len, tuple(req.all_ids[req.kv_len:])


def build_verify_at(feeds: Sequence[tuple[int, int, Sequence[int]]],
                    trees: Sequence[DraftTree], memory: Any,
                    device: torch.device) -> tuple[ForwardBatch, VerifyLayout] | None:
    """``build_verify`` from each request's ``feed_of`` (also one ahead of time: prebuild.py).
    Host work: one host tensor of the indices, one upload (slots included), no per-token
    tensor op."""
    rows, cols, ids, pos, first, fed, verify_rows, compact = [], [], [], [], [], [], [], []
    for (row, p, feed), tree in zip(feeds, trees):
        f, n = len(feed), len(tree)
        root = p + f - 1
        first.append(len(cols) + f - 1)
        compact.append(len(verify_rows))
        verify_rows.extend(range(first[-1], first[-1] + n + 1))
        fed.append(f)
        rows.extend([row] * (f + n))
        cols.extend(range(p, p + f + n))
        ids.extend(feed)
        ids.extend(tree.tokens)
        pos.extend(range(p, p + f))
        pos.extend([root + d for d in tree.depths] if not tree.is_chain
                   else range(root + 1, root + 1 + n))
    total = len(cols)
    host = torch.tensor(rows + cols + ids + pos, dtype=torch.int64)
    slots = memory.reserve_at(host[:total], host[total:2 * total])
    if slots is None:
        return None
    index = to_device(torch.cat((host, slots.to(torch.int64))), device)
    rows_d, cols_d, ids_d = index[:total], index[total:2 * total], index[2 * total:3 * total]
    pos_d, slots_d = index[3 * total:4 * total], index[4 * total:]
    memory.write_table(rows_d, cols_d, slots_d)
    prefix = [p for _, p, _ in feeds]
    kv_lens = [p + f - 1 for p, f in zip(prefix, fed)]
    layout = VerifyLayout(first, kv_lens, slots, verify_rows, compact)
    if all(t.is_chain for t in trees):
        batch = _rows_batch(rows_d, cols_d, slots_d, ids_d, cols, device)
    else:
        batch = _tree_batch(prefix, trees, fed, rows_d, slots_d, ids_d, pos_d, device)
    return batch, layout


_CONSTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _ones_arange(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``ones(n)`` and ``arange(n)`` (int64) on ``device``: views of tensors kept per device
    (never written: a verify step allocates nothing for them)."""
    kept = _CONSTS.get(device)
    if kept is None or kept[0].shape[0] < n:
        size = max(2 * n, 64)
        kept = _CONSTS[device] = (torch.ones(size, dtype=torch.int64, device=device),
                                  torch.arange(size, dtype=torch.int64, device=device))
    return kept[0][:n], kept[1][:n]


def _rows_batch(rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor,
                ids: torch.Tensor, cols_host: list[int], device: torch.device) -> ForwardBatch:
    """Chains: one decode row per fed token (position == column)."""
    total = len(cols_host)
    ones, arange = _ones_arange(total, device)
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=total, input_ids=ids, positions=cols,
        req_pool_indices=rows, seq_lens=cols + 1, out_cache_loc=slots,
        extend_prefix_lens=cols, extend_seq_lens=ones, extend_start_loc=arange,
        seq_lens_cpu=[c + 1 for c in cols_host], extend_prefix_lens_cpu=list(cols_host),
        extend_seq_lens_cpu=[1] * total)


def _tree_batch(prefix: list[int], trees: Sequence[DraftTree], fed: list[int],
                rows: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor,
                device: torch.device) -> ForwardBatch:
    """Trees: an extend of ``f + n`` tokens per request on top of its KV (``prefix``),
    tree-masked."""
    lens = [f + len(t) for f, t in zip(fed, trees)]
    starts = [sum(lens[:i]) for i in range(len(lens))]
    dev = lambda v: to_device(torch.tensor(v, dtype=torch.int64), device)  # noqa: E731
    total = sum(lens)
    return ForwardBatch(
        mode=ForwardMode.TARGET_VERIFY, batch_size=len(prefix), input_ids=ids, positions=pos,
        req_pool_indices=rows.index_select(0, dev(starts)),
        seq_lens=dev([p + n for p, n in zip(prefix, lens)]), out_cache_loc=slots,
        extend_prefix_lens=dev(prefix), extend_seq_lens=dev(lens), extend_start_loc=dev(starts),
        logits_indices=torch.arange(total, dtype=torch.int64, device=device),
        seq_lens_cpu=[p + n for p, n in zip(prefix, lens)], extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=lens, spec_info=TreeMask.build(trees, device, fed))

"""The step graphs' two operations around the forward (model/step_graphs.py): ``prepare`` (each
live row's new KV slot into the request->slot table, its last token as its input) and
``finish`` (each row's greedy id into ``ids``, ``last_token`` and the host ring). On CUDA one
Triton kernel each (runtime/kernels/decode_step.py, which documents both), captured in the
graph; elsewhere (a CPU's eager step) torch ops computing the same, which the kernels' tests
use as the reference.

Live rows: ``meta[DEST, i] != sink`` (padded rows and explicit batches have none).
"""
from __future__ import annotations

import torch

from ..distributed.collectives import all_gather
from ..layers.sampler import argmax_chunks, greedy_argmax

ROWS, POS, LENS, LOCS, DEST, SLOT = range(6)  # rows of ``meta`` (kernels/decode_step.py)


def prepare(meta: torch.Tensor, n: int, last_token: torch.Tensor, table: torch.Tensor,
            input_ids: torch.Tensor, sink: int) -> None:
    if meta.is_cuda:
        from ..kernels import decode_step

        decode_step.prepare(meta, n, last_token, table, input_ids, sink)
    else:
        prepare_ref(meta, n, last_token, table, input_ids, sink)


def prepare_ref(meta: torch.Tensor, n: int, last_token: torch.Tensor, table: torch.Tensor,
                input_ids: torch.Tensor, sink: int) -> None:
    live = meta[DEST, :n] != sink  # NOTE: a host sync on a GPU: the reference only
    rows, pos = meta[ROWS, :n][live], meta[POS, :n][live]
    table[rows, pos] = meta[LOCS, :n][live]
    input_ids[:n][live] = last_token[rows]


def finish(logits: torch.Tensor, meta: torch.Tensor, last_token: torch.Tensor,
           ring: torch.Tensor | None, sink: int) -> torch.Tensor:
    """Greedy ids of the logits' rows. ``ring`` (page-locked, ``[slots, max_bs]``) or None;
    on CUDA a ring needs a vocabulary ``argmax_chunks`` splits (``ring_ok``)."""
    chunks = argmax_chunks(logits.shape[-1])
    if logits.is_cuda and chunks:
        from ..kernels import decode_step

        return decode_step.finish(logits, chunks, meta, last_token, ring, sink)
    assert ring is None or not logits.is_cuda, "a host ring on CUDA needs the kernel"
    return finish_ref(logits, meta, last_token, ring, sink)


def finish_ref(logits: torch.Tensor, meta: torch.Tensor, last_token: torch.Tensor,
               ring: torch.Tensor | None, sink: int) -> torch.Tensor:
    return _record(greedy_argmax(logits), meta, last_token, ring, sink)


def pick_local(local: torch.Tensor, offset: int, meta: torch.Tensor, last_token: torch.Tensor,
               ring: torch.Tensor | None, sink: int) -> torch.Tensor:
    """tp-step: the greedy ids from this rank's logit columns ``local`` (ids from ``offset``;
    ``layers/vocab_parallel.local_logits``) without all-gathering the logits: each row's first
    maximum here, one (value, id) pair per row all-gathered over the TP group, and the first
    rank holding the largest value wins: the first index of the full logits' maximum, what
    ``finish`` picks from all-gathered logits (the same values, bit for bit). Then as
    ``finish``. Ids are exact in fp32 below 2**24."""
    if local.is_cuda:
        from ..kernels import decode_step

        pairs = all_gather(decode_step.local_max(local, offset), dim=0)  # [tp * n, 2]
        return decode_step.finish_gathered(pairs.view(-1, local.shape[0], 2), meta,
                                           last_token, ring, sink)
    vals, idx = local.max(dim=-1)
    pair = torch.stack([vals.float(), (idx + offset).to(torch.float32)], dim=-1)
    pairs = all_gather(pair, dim=0).view(-1, local.shape[0], 2)  # [tp, n, 2]
    best = pairs[..., 0].argmax(dim=0, keepdim=True)  # the first rank with the maximum
    ids = pairs[..., 1].gather(0, best).squeeze(0).to(torch.int64)
    return _record(ids, meta, last_token, ring, sink)


def _record(ids: torch.Tensor, meta: torch.Tensor, last_token: torch.Tensor,
            ring: torch.Tensor | None, sink: int) -> torch.Tensor:
    """``ids`` into ``last_token`` by destination and, for live rows, into the ring."""
    n = ids.shape[0]
    dest = meta[DEST, :n]
    last_token.index_copy_(0, dest, ids)
    if ring is not None:  # live rows only (an explicit batch writes none)
        live = (dest != sink).to(ring.device)
        ring[int(meta[SLOT, 0]), :n][live] = ids.to(ring.device)[live]
    return ids


def ring_ok(device: torch.device, vocab: int) -> bool:
    """Whether ``finish`` can write a host ring for logits ``vocab`` wide on ``device``."""
    return device.type != "cuda" or argmax_chunks(vocab) is not None

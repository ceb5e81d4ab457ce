"""Forward batches of a draft model over its own KV table (``DraftKV``).

A ``Feed`` is one request's tokens for one draft forward: row ``row`` of the draft's
``req_to_token``, the tokens ``ids`` fed at positions ``start .. start + len(ids) - 1`` into
the (already reserved and written) ``slots``.

Short feeds (at most ``DECODE_ROWS_MAX`` tokens each: a speculative step's accepted drafts and
the target's token) make a DECODE batch with one row per token: the rows of one feed share its
table row with lengths growing by one, so each attends to the KV up to its own token (a layer
stores all its new KV before attending). That is the CPU decoder's and the CUDA graphs' path
(as the verifier's chain batches); logits come for every row (``last_rows`` picks each feed's
last). Longer feeds (a prompt) make an EXTEND batch whose logits rows are each feed's last
token, or every token with ``all_rows``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.upload import to_device
from ..model.forward_batch import ForwardBatch, ForwardMode

# NOTE: a feed this short costs one decode row per token; the extend path's per-request
# attention calls and missing CUDA graphs cost more than the extra rows.
DECODE_ROWS_MAX = 8


@dataclass(frozen=True)
class Feed:
    row: int
    start: int
    ids: list[int]
    slots: torch.Tensor  # CPU int64, len(ids)


def last_rows(feeds: list[Feed]) -> list[int]:
    """Each feed's last token among the flattened rows."""
    out, at = [], 0
    for f in feeds:
        at += len(f.ids)
        out.append(at - 1)
    return out


def build_batch(feeds: list[Feed], device: torch.device, all_rows: bool = False) -> ForwardBatch:
    """One forward over every feed (see module docstring)."""
    if max(len(f.ids) for f in feeds) <= DECODE_ROWS_MAX:
        return _decode_rows(feeds, device)
    lens = [len(f.ids) for f in feeds]
    starts = [f.start for f in feeds]
    seq_lens = [s + n for s, n in zip(starts, lens)]
    ids = [t for f in feeds for t in f.ids]
    positions = torch.cat([torch.arange(f.start, f.start + len(f.ids)) for f in feeds])
    ext = torch.tensor(lens, dtype=torch.int64)
    dev = lambda t: to_device(t, device)  # noqa: E731
    logits = dev(torch.arange(len(ids), dtype=torch.int64)) if all_rows else None
    return ForwardBatch(
        mode=ForwardMode.EXTEND, batch_size=len(feeds),
        input_ids=dev(torch.tensor(ids, dtype=torch.int64)), positions=dev(positions),
        req_pool_indices=dev(torch.tensor([f.row for f in feeds], dtype=torch.int64)),
        seq_lens=dev(torch.tensor(seq_lens, dtype=torch.int64)),
        out_cache_loc=dev(torch.cat([f.slots for f in feeds])),
        extend_prefix_lens=dev(torch.tensor(starts, dtype=torch.int64)),
        extend_seq_lens=dev(ext), extend_start_loc=dev(torch.cumsum(ext, 0) - ext),
        logits_indices=logits, seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=starts,
        extend_seq_lens_cpu=lens)


def _decode_rows(feeds: list[Feed], device: torch.device) -> ForwardBatch:
    """A DECODE batch with one row per fed token (see module docstring)."""
    rows = [f.row for f in feeds for _ in f.ids]
    pos = [f.start + j for f in feeds for j in range(len(f.ids))]
    ids = [t for f in feeds for t in f.ids]
    n = len(ids)
    index = torch.tensor(rows + pos + ids, dtype=torch.int64)
    rows_d, pos_d, ids_d = to_device(index, device).split(n)
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=n, input_ids=ids_d, positions=pos_d,
        req_pool_indices=rows_d, seq_lens=pos_d + 1,
        out_cache_loc=to_device(torch.cat([f.slots for f in feeds]), device),
        extend_prefix_lens=pos_d, extend_seq_lens=torch.ones(n, dtype=torch.int64, device=device),
        extend_start_loc=torch.arange(n, dtype=torch.int64, device=device),
        seq_lens_cpu=[p + 1 for p in pos], extend_prefix_lens_cpu=pos, extend_seq_lens_cpu=[1] * n)

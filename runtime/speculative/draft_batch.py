"""Forward batches of a draft model over its own KV table (``DraftKV``).

A ``Feed`` is one request's tokens for one draft forward: row ``row`` of the draft's
``req_to_token``, the tokens ``ids`` fed at positions ``start .. start + len(ids) - 1`` into
the (already reserved and written) ``slots``. One token per feed makes a DECODE batch (the
CPU decoder's and the CUDA graphs' path), anything else an EXTEND batch whose logits rows are
each feed's last token, or every token with ``all_rows`` (EAGLE heads want every row's hidden).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.upload import to_device
from ..model.forward_batch import ForwardBatch, ForwardMode


@dataclass(frozen=True)
class Feed:
    row: int
    start: int
    ids: list[int]
    slots: torch.Tensor  # CPU int64, len(ids)


def build_batch(feeds: list[Feed], device: torch.device, all_rows: bool = False) -> ForwardBatch:
    """One forward over every feed (see module docstring)."""
    lens = [len(f.ids) for f in feeds]
    starts = [f.start for f in feeds]
    seq_lens = [s + n for s, n in zip(starts, lens)]
    ids = [t for f in feeds for t in f.ids]
    positions = torch.cat([torch.arange(f.start, f.start + len(f.ids)) for f in feeds])
    ext = torch.tensor(lens, dtype=torch.int64)
    dev = lambda t: to_device(t, device)  # noqa: E731
    decode = all(n == 1 for n in lens)
    logits = None
    if not decode and all_rows:
        logits = dev(torch.arange(len(ids), dtype=torch.int64))
    return ForwardBatch(
        mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=len(feeds),
        input_ids=dev(torch.tensor(ids, dtype=torch.int64)), positions=dev(positions),
        req_pool_indices=dev(torch.tensor([f.row for f in feeds], dtype=torch.int64)),
        seq_lens=dev(torch.tensor(seq_lens, dtype=torch.int64)),
        out_cache_loc=dev(torch.cat([f.slots for f in feeds])),
        extend_prefix_lens=dev(torch.tensor(starts, dtype=torch.int64)),
        extend_seq_lens=dev(ext), extend_start_loc=dev(torch.cumsum(ext, 0) - ext),
        logits_indices=logits, seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=starts,
        extend_seq_lens_cpu=lens)

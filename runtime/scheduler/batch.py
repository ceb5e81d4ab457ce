"""Building ForwardBatch objects for extend (prefill, mixed lengths, cached prefixes); decode
batches come from the persistent ``RunningBatch`` (running.py).

For an extend batch, ``logits_indices`` selects for each request a contiguous run of rows ending
at its last new token: just that row normally, or every row from ``logprob_start_len - 1`` when
prompt logprobs are wanted. ``ExtendLayout`` records where each request's rows landed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.upload import to_device
from ..model.forward_batch import ForwardBatch, ForwardMode
from ..multimodal.inputs import build_mm_batch
from .req import Req


@dataclass(frozen=True)
class ExtendLayout:
    """Per request: first logits row, number of rows, and the position of that first row."""

    logit_start: list[int]
    logit_count: list[int]
    first_pos: list[int]

    def last_row(self, i: int) -> int:
        return self.logit_start[i] + self.logit_count[i] - 1


def _first_logit_pos(req: Req) -> int:
    last = req.kv_len + req.extend_len - 1
    if req.forced_logprobs_owed:  # grammar: rows scoring the jump-forward tokens
        return min(max(req.seq_len - req.forced_logprobs_owed - 1, req.kv_len), last)
    if not req.needs_prompt_logprobs:
        return last
    want = max(req.logprob_start_len, 1) - 1  # row t-1 scores prompt token t
    return min(max(want, req.kv_len), last)


def build_extend(reqs: list[Req], device: torch.device) -> tuple[ForwardBatch, ExtendLayout]:
    """Requests must hold ``extend_len`` reserved slots after their first ``kv_len`` tokens."""
    ids: list[int] = []
    positions: list[torch.Tensor] = []
    logit_rows: list[torch.Tensor] = []
    starts, counts, firsts, prefix_lens, ext_lens, seq_lens = [], [], [], [], [], []
    offset = 0
    for req in reqs:
        p, e = req.kv_len, req.extend_len
        ids.extend(req.all_ids[p:p + e])
        positions.append(torch.arange(p, p + e, dtype=torch.int64))
        first = _first_logit_pos(req)
        starts.append(sum(counts))
        counts.append(p + e - first)
        firsts.append(first)
        logit_rows.append(torch.arange(offset + first - p, offset + e, dtype=torch.int64))
        prefix_lens.append(p)
        ext_lens.append(e)
        seq_lens.append(p + e)
        offset += e
    rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
    ext = torch.tensor(ext_lens, dtype=torch.int64)
    start_loc = torch.cumsum(ext, 0) - ext
    table = torch.cat([r.extend_slots for r in reqs])
    dev = lambda t: to_device(t, device)  # noqa: E731 - non-blocking (overlap scheduling)
    batch = ForwardBatch(
        mode=ForwardMode.EXTEND, batch_size=len(reqs),
        input_ids=dev(torch.tensor(ids, dtype=torch.int64)),
        positions=dev(torch.cat(positions)), req_pool_indices=dev(rows),
        seq_lens=dev(torch.tensor(seq_lens, dtype=torch.int64)), out_cache_loc=dev(table),
        extend_prefix_lens=dev(torch.tensor(prefix_lens, dtype=torch.int64)),
        extend_seq_lens=dev(ext), extend_start_loc=dev(start_loc),
        logits_indices=dev(torch.cat(logit_rows)),
        seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=prefix_lens, extend_seq_lens_cpu=ext_lens)
    batch.mm_inputs = build_mm_batch(reqs, device)  # mm: image rows, M-RoPE positions
    return batch, ExtendLayout(starts, counts, firsts)

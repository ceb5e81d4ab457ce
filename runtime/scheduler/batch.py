"""Building ForwardBatch objects for extend (prefill, mixed lengths, cached prefixes) and decode.

For an extend batch, ``logits_indices`` selects for each request a contiguous run of rows ending
at its last new token: just that row normally, or every row from ``logprob_start_len - 1`` when
prompt logprobs are wanted. ``ExtendLayout`` records where each request's rows landed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.forward_batch import ForwardBatch, ForwardMode
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
    batch = ForwardBatch(
        mode=ForwardMode.EXTEND, batch_size=len(reqs),
        input_ids=torch.tensor(ids, dtype=torch.int64).to(device),
        positions=torch.cat(positions).to(device),
        req_pool_indices=rows.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64).to(device),
        out_cache_loc=table.to(device),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64).to(device),
        extend_seq_lens=ext.to(device), extend_start_loc=start_loc.to(device),
        logits_indices=torch.cat(logit_rows).to(device),
        seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=prefix_lens, extend_seq_lens_cpu=ext_lens)
    return batch, ExtendLayout(starts, counts, firsts)


def build_decode(reqs: list[Req], slots: torch.Tensor, device: torch.device) -> ForwardBatch:
    """One new token per request: its last sampled token, at position ``seq_len - 1``."""
    bs = len(reqs)
    seq_lens = [r.seq_len for r in reqs]
    prefix = [s - 1 for s in seq_lens]
    seq_t = torch.tensor(seq_lens, dtype=torch.int64)
    ones = torch.ones(bs, dtype=torch.int64)
    arange = torch.arange(bs, dtype=torch.int64)
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=bs,
        input_ids=torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64).to(device),
        positions=(seq_t - 1).to(device),
        req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64).to(device),
        seq_lens=seq_t.to(device), out_cache_loc=slots.to(device),
        extend_prefix_lens=(seq_t - 1).to(device), extend_seq_lens=ones.to(device),
        extend_start_loc=arange.to(device), logits_indices=arange.to(device),
        seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=[1] * bs)

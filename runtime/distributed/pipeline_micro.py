"""pp: micro-batches in flight inside one forward.

A batch large enough (``EngineConfig.pp_micro_batch_tokens`` tokens or more per part) is split
by requests into up to ``pp_size`` micro-batches that go down the pipeline one after another:
stage s runs micro-batch i + 1 while stage s + 1 runs micro-batch i, so with m parts the
stages are busy ``m / (m + pp_size - 1)`` of the step instead of ``1 / pp_size``. Receives are
posted for every part up front and sends do not wait, so on the GPU the transfers overlap the
next part's compute (NCCL streams); on CPU (gloo) the order is the same, the overlap only that
of the processes.

Each part re-reads the stage's weights, so splitting pays only where a part's compute outweighs
its weight reads: prefill chunks and large decode batches, never small decode batches (the
default threshold keeps batch-1 and moderate decode whole). The last stage's per-part logits
are concatenated in request order, which is the order the scheduler expects.
"""
from __future__ import annotations

import dataclasses

import torch

from ..model.forward_batch import ForwardBatch


def plan_parts(batch: ForwardBatch, max_parts: int, min_tokens: int) -> list[tuple[int, int]]:
    """Request ranges ``[r0, r1)`` of the micro-batches: contiguous, about equal in tokens,
    each at least ``min_tokens`` (one part, the whole batch, when the batch is too small)."""
    lens = batch.extend_seq_lens_cpu or [1] * batch.batch_size
    parts = min(max_parts, batch.batch_size, batch.num_tokens // max(min_tokens, 1))
    if parts <= 1 or len(lens) != batch.batch_size:
        return [(0, batch.batch_size)]
    bounds, acc, goal = [0], 0, batch.num_tokens / parts
    for r, n in enumerate(lens[:-1]):
        acc += n
        target = goal * len(bounds)
        # cut after request r where that lands nearer the target than the next one would
        if len(bounds) < parts and (acc >= target or target - acc < acc + lens[r + 1] - target):
            bounds.append(r + 1)
    bounds.append(batch.batch_size)
    return list(zip(bounds[:-1], bounds[1:]))


def split(batch: ForwardBatch, ranges: list[tuple[int, int]]) -> list[ForwardBatch]:
    """The micro-batches of ``ranges`` (their tokens, KV slots and logits rows)."""
    lens = batch.extend_seq_lens_cpu or [1] * batch.batch_size
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    rows = None if batch.logits_indices is None else batch.logits_indices.tolist()
    return [_part(batch, r0, r1, starts[r0], starts[r1], rows) for r0, r1 in ranges]


def _part(b: ForwardBatch, r0: int, r1: int, t0: int, t1: int,
          rows: list[int] | None) -> ForwardBatch:
    logits = None
    if rows is not None:  # NOTE: the scheduler lists logits rows in token order
        mine = [r - t0 for r in rows if t0 <= r < t1]
        logits = torch.tensor(mine, dtype=torch.int64).to(b.input_ids.device, non_blocking=True)
    return dataclasses.replace(
        b, batch_size=r1 - r0, input_ids=b.input_ids[t0:t1], positions=b.positions[t0:t1],
        req_pool_indices=b.req_pool_indices[r0:r1], seq_lens=b.seq_lens[r0:r1],
        out_cache_loc=b.out_cache_loc[t0:t1], extend_prefix_lens=b.extend_prefix_lens[r0:r1],
        extend_seq_lens=b.extend_seq_lens[r0:r1],
        extend_start_loc=b.extend_start_loc[r0:r1] - t0, logits_indices=logits,
        seq_lens_cpu=b.seq_lens_cpu[r0:r1], extend_prefix_lens_cpu=b.extend_prefix_lens_cpu[r0:r1],
        extend_seq_lens_cpu=b.extend_seq_lens_cpu[r0:r1],
        shared_prefix=None,  # NOTE: an optimization only (never changes results); per batch
        attn_metadata=None, pp_proxy=None)

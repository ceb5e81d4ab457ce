"""Test driver for a ModelRunner without the scheduler: owns request rows, allocates KV slots
and builds ForwardBatch objects for extend (prefill on top of a cached prefix) and decode."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode


@dataclass
class DriverRequest:
    row: int
    tokens: list[int] = field(default_factory=list)  # tokens whose KV is in the cache


class RunnerDriver:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.device = runner.device

    def new_request(self, prefix_from: DriverRequest | None = None,
                    prefix_len: int = 0) -> DriverRequest:
        """A request row; optionally reusing the first ``prefix_len`` cached slots of another
        request (what a radix-cache hit does)."""
        row = self.runner.req_to_token_pool.alloc()
        assert row is not None
        req = DriverRequest(row)
        if prefix_from is not None and prefix_len:
            table = self.runner.req_to_token_pool.req_to_token
            table[row, :prefix_len] = table[prefix_from.row, :prefix_len]
            req.tokens = list(prefix_from.tokens[:prefix_len])
        return req

    def extend(self, items: list[tuple[DriverRequest, list[int]]],
               logits_indices: list[int] | None = None) -> torch.Tensor:
        """Append new tokens to each request in one EXTEND forward; returns the runner's logits."""
        prefix = [len(r.tokens) for r, _ in items]
        lens = [len(t) for _, t in items]
        return self._run(ForwardMode.EXTEND, items, prefix, lens, logits_indices)

    def decode(self, items: list[tuple[DriverRequest, int]]) -> torch.Tensor:
        pairs = [(r, [t]) for r, t in items]
        return self._run(ForwardMode.DECODE, pairs, [len(r.tokens) for r, _ in pairs],
                         [1] * len(pairs), None)

    def release(self, req: DriverRequest, keep_prefix: int = 0) -> None:
        """Free the request's row and its KV slots, except the first ``keep_prefix`` (slots
        it borrowed from another request)."""
        if len(req.tokens) > keep_prefix:
            table = self.runner.req_to_token_pool.req_to_token
            self.runner.token_kv_pool.free(table[req.row, keep_prefix: len(req.tokens)].cpu())
        self.runner.req_to_token_pool.free(req.row)

    def _run(self, mode: ForwardMode, items, prefix: list[int], lens: list[int],
             logits_indices: list[int] | None) -> torch.Tensor:
        total = sum(lens)
        slots = self.runner.token_kv_pool.alloc(total)
        assert slots is not None, "KV pool exhausted"
        table = self.runner.req_to_token_pool.req_to_token
        ids, positions, start = [], [], 0
        for (req, new), p, n in zip(items, prefix, lens):
            table[req.row, p: p + n] = slots[start: start + n].to(self.device)
            ids += new
            positions += range(p, p + n)
            req.tokens += new
            start += n
        batch = self._batch(mode, items, ids, positions, slots, prefix, lens, logits_indices)
        # NOTE: a copy: a replayed CUDA graph's logits are views into its static output buffer,
        # which the next replay overwrites (parity compares rows of every step at the end)
        return self.runner.forward(batch).clone()

    def _batch(self, mode, items, ids, positions, slots, prefix, lens, logits_indices) -> ForwardBatch:
        dev = self.device

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=dev)

        seq = [p + n for p, n in zip(prefix, lens)]
        starts = [sum(lens[:i]) for i in range(len(lens))]
        return ForwardBatch(
            mode=mode, batch_size=len(items), input_ids=t(ids), positions=t(positions),
            req_pool_indices=t([r.row for r, _ in items]), seq_lens=t(seq),
            out_cache_loc=slots.to(dev), extend_prefix_lens=t(prefix), extend_seq_lens=t(lens),
            extend_start_loc=t(starts),
            logits_indices=None if logits_indices is None else t(logits_indices),
            seq_lens_cpu=seq, extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=lens)

"""A minimal greedy driver straight on a ModelRunner (no scheduler process): allocates request
rows and KV slots, builds extend/decode ForwardBatches, and feeds back argmax tokens.

Used by the GPU checks to compare attention backends and CUDA graphs token for token, and to
time the model step without scheduler overhead. Prefix sharing is explicit: ``share_prefix``
points a new request at another request's first n slots, as a radix-cache hit would.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode


@dataclass
class Seq:
    row: int
    tokens: list[int]  # prompt + generated so far
    cached: int = 0  # tokens whose KV is in the pool
    slots: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)


class Driver:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.dev = runner.device

    def new_seq(self, prompt: list[int], share_from: Seq | None = None, share: int = 0) -> Seq:
        seq = Seq(self.runner.req_to_token_pool.alloc(), list(prompt))
        if share_from is not None and share:
            seq.slots = share_from.slots[:share]
            seq.cached = share
            self._write_row(seq, 0)
        return seq

    def _write_row(self, seq: Seq, start: int) -> None:
        r2t = self.runner.req_to_token_pool.req_to_token
        r2t[seq.row, start:len(seq.slots)] = torch.tensor(seq.slots[start:], device=self.dev)

    def _tensor(self, xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int64, device=self.dev)

    def extend(self, seqs: list[Seq], chunk: int | None = None) -> list[int | None]:
        """Prefill up to ``chunk`` uncached tokens of each seq; returns the greedy next token
        of seqs whose prompt is now fully cached (None for the rest)."""
        ids, pos, loc, prefix, lens = [], [], [], [], []
        for s in seqs:
            n = len(s.tokens) - s.cached if chunk is None else min(chunk, len(s.tokens) - s.cached)
            new = self.runner.token_kv_pool.alloc(n).tolist()
            start = len(s.slots)
            s.slots += new
            self._write_row(s, start)
            ids += s.tokens[s.cached:s.cached + n]
            pos += list(range(s.cached, s.cached + n))
            loc += new
            prefix.append(s.cached)
            lens.append(n)
            s.cached += n
        starts = [sum(lens[:i]) for i in range(len(lens))]
        seq_lens = [p + n for p, n in zip(prefix, lens)]
        batch = ForwardBatch(
            ForwardMode.EXTEND, len(seqs), self._tensor(ids), self._tensor(pos),
            self._tensor([s.row for s in seqs]), self._tensor(seq_lens), self._tensor(loc),
            self._tensor(prefix), self._tensor(lens), self._tensor(starts),
            seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=lens)
        nxt = self.runner.forward(batch).argmax(-1).tolist()
        done = []
        for s, t in zip(seqs, nxt):
            full = s.cached == len(s.tokens)
            if full:
                s.tokens.append(t)
                s.out.append(t)
            done.append(t if full else None)
        return done

    def decode(self, seqs: list[Seq]) -> list[int]:
        """One decode step for seqs whose last token is not cached yet."""
        loc = self.runner.token_kv_pool.alloc(len(seqs)).tolist()
        for s, slot in zip(seqs, loc):
            s.slots.append(slot)
            self.runner.req_to_token_pool.req_to_token[s.row, len(s.slots) - 1] = slot
        seq_lens = [len(s.tokens) for s in seqs]
        batch = ForwardBatch(
            ForwardMode.DECODE, len(seqs), self._tensor([s.tokens[-1] for s in seqs]),
            self._tensor([n - 1 for n in seq_lens]), self._tensor([s.row for s in seqs]),
            self._tensor(seq_lens), self._tensor(loc), self._tensor([n - 1 for n in seq_lens]),
            self._tensor([1] * len(seqs)), self._tensor(list(range(len(seqs)))),
            seq_lens_cpu=seq_lens, extend_prefix_lens_cpu=[n - 1 for n in seq_lens],
            extend_seq_lens_cpu=[1] * len(seqs))
        nxt = self.runner.forward(batch).argmax(-1).tolist()
        for s, t in zip(seqs, nxt):
            s.cached = len(s.tokens)
            s.tokens.append(t)
            s.out.append(t)
        return nxt

    def release(self, seqs: list[Seq], owned_from: int = 0) -> None:
        for s in seqs:
            self.runner.token_kv_pool.free(torch.tensor(s.slots[owned_from:], dtype=torch.int64))
            self.runner.req_to_token_pool.free(s.row)

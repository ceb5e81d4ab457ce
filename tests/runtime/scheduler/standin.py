"""A deterministic stand-in model for scheduler tests, driven through the real ForwardBatch.

It stores each token id as its "KV" in the real TokenKVPool and computes the next token from
the ids it reads back through ``req_to_token``, so any KV bookkeeping bug (a wrong slot, a
prefix freed too early, a lost token after retraction) changes the output. ``expected`` computes
the same sequence directly, without any KV.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from sgdsl.runtime.cache.pool import ReqToTokenPool, TokenKVPool
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.model.forward_batch import ForwardBatch
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.scheduler import Scheduler

VOCAB = 50
EOS = 0


def next_token(seq: list[int]) -> int:
    """The stand-in's greedy choice after ``seq``; never EOS unless the sum says so."""
    return (sum(seq) * 7 + len(seq) * 3) % VOCAB


def expected(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        t = next_token(seq)
        out.append(t)
        seq.append(t)
    return out


class StandInRunner:
    def __init__(self, num_slots: int, max_reqs: int = 16, context_len: int = 256) -> None:
        self.req_to_token_pool = ReqToTokenPool(max_reqs, context_len, "cpu")
        self.token_kv_pool = TokenKVPool(num_slots, 1, 1, 1, torch.float64, "cpu")
        self.context_len = context_len
        # The real runner's model shape, as far as the scheduler's features read it (PD's
        # prefill side splits the KV heads by rank): one head, as the pool holds.
        self.model_config = SimpleNamespace(num_kv_heads=1)
        self.forwards: list[ForwardBatch] = []

    def forward(self, b: ForwardBatch) -> torch.Tensor:
        self.forwards.append(b)
        logits = self.logits(self.sequences(b))
        # NOTE: no logits_indices (decode): one row per request, as the real runner does.
        return logits if b.logits_indices is None else logits[b.logits_indices]

    def sequences(self, b: ForwardBatch) -> list[list[int]]:
        """Stores the batch's ids as their KV, then reads back, for every extend row, the
        sequence up to it through ``req_to_token``."""
        kv = self.token_kv_pool.k_buffer[0]
        kv[b.out_cache_loc, 0, 0] = b.input_ids.double()
        seqs = []
        for i in range(b.batch_size):
            row = int(b.req_pool_indices[i])
            p, e = b.extend_prefix_lens_cpu[i], b.extend_seq_lens_cpu[i]
            for j in range(e):
                slots = self.req_to_token_pool.req_to_token[row, : p + j + 1]
                seqs.append([int(x) for x in kv[slots, 0, 0].tolist()])
        return seqs

    def logits(self, seqs: list[list[int]]) -> torch.Tensor:
        """A smooth, peaked row per sequence: softmax is non-trivial, argmax is ``next_token``."""
        target = torch.tensor([next_token(seq) for seq in seqs], dtype=torch.int64)
        return -0.5 * (torch.arange(VOCAB).view(1, -1) - target.view(-1, 1)).abs().float()


@dataclass
class Harness:
    sched: Scheduler
    runner: StandInRunner
    outs: dict = field(default_factory=dict)
    finish: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    last: dict = field(default_factory=dict)

    def send(self, msg) -> None:
        for o in msg.outs:
            self.outs.setdefault(o.rid, []).extend(o.new_ids)
            self.order.append(o.rid)
            merged = self.last.setdefault(o.rid, {"in": None, "out": []})
            if o.input_token_logprobs is not None:
                merged["in"] = o.input_token_logprobs
            merged["out"].extend(o.output_token_logprobs or [])
            if o.finish_reason is not None:
                assert o.rid not in self.finish, f"{o.rid} finished twice"
                self.finish[o.rid] = o.finish_reason

    def submit(self, rid: str, ids: list[int], **params) -> None:
        lp = {k: params.pop(k) for k in ("return_logprob", "logprob_start_len", "top_logprobs_num",
                                         "stream") if k in params}
        lp.setdefault("stream", True)
        params.setdefault("temperature", 0.0)
        self.sched.handle(m.TokenizedGenerateReq(rid, ids, SamplingParams(**params), **lp))

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.sched.step():
                return
        raise AssertionError("scheduler did not become idle")

    def check_idle(self) -> None:
        resp = self.sched._integrity_resp(0)
        assert resp.ok, resp.error



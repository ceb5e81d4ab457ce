"""Stepping: the half of the Scheduler that launches a step and reads it back.

Launching queues a forward and its sampling on the device (``_launch_extend`` /
``_launch_decode``): the sampled ids become the next decode step's inputs on the device and
start their copy to the host. Reading (``_read``) appends the tokens of the requests still live,
checks finish conditions and updates the running batch. The Scheduler (scheduler.py) decides
what to launch and when to read (right away, or one launch late with overlap scheduling).
"""
from __future__ import annotations

from typing import Any

import torch

from ..model.forward_batch import ForwardMode
from .batch import build_extend
from .inflight import HostIds, InflightStep
from .output import record_forced_logprobs, record_output_logprobs, record_prompt_logprobs
from .req import Req, ReqState
from .running import to_device

_EMPTY = torch.empty(0, dtype=torch.int64)
# NOTE: share of a running request's remaining tokens that admission keeps free for its decode
# decays by this much per decode step (scheduler.py resets it after a retraction).
NEW_TOKEN_RATIO_DECAY = 0.001
MIN_NEW_TOKEN_RATIO = 0.1


class Stepping:
    """Mixin of Scheduler; uses its runner, memory, running batch, sampler and grammar."""

    # -- launching a step (forward + sampling, queued on the device) ---------------------------
    def _launch_extend(self, reqs: list[Req]) -> InflightStep:
        batch, layout = build_extend(reqs, self.device)
        step = InflightStep.launched(ForwardMode.EXTEND, reqs, self._must_sync(reqs))
        idx = [i for i, r in enumerate(reqs)
               if r.kv_len + r.extend_len >= r.seq_len and not r.is_prefill_only]
        step.sampled = [reqs[i] for i in idx]
        mask = self.grammar.fill_bitmask(step.sampled) if self.grammar else None  # grammar
        logits = self.runner.forward(batch)
        for req in reqs:
            req.kv_len += req.extend_len
            req.extend_len, req.extend_slots = 0, _EMPTY
            if req.is_prefill_only and req.kv_len == req.seq_len:
                req.finish_reason = {"type": "length", "length": 0}
                continue
            # NOTE: cache what was computed right away (not only at the end), so a chunk is
            # protected from eviction and waiting requests sharing this prompt reuse it.
            self.memory.cache_chunk(req)
        if step.sync:
            step.extend_logits, step.layout = logits, layout
        if step.sampled:
            last = to_device(torch.tensor([layout.last_row(i) for i in idx]), self.device)
            step.info = self.sampler.new_info(step.sampled, logits.shape[-1])
            table_rows = torch.tensor([r.req_pool_idx for r in step.sampled])
            self._sample(step, logits.index_select(0, last), step.info, mask,
                         to_device(table_rows, self.device))
        return step

    def _launch_decode(self) -> InflightStep | None:
        if self.pending is not None and self.memory.available() < len(self.running):
            self._read(self.pending)  # requests it finished free KV: retract only if still short
        self._make_room_for_decode()
        if not self.running:
            return None
        reqs = self.running.reqs
        slots = self.memory.reserve_decode(self.running)
        assert slots is not None, "decode KV reservation failed after retraction"
        step = InflightStep.launched(ForwardMode.DECODE, reqs, self._must_sync(reqs))
        step.sampled = reqs
        mask = self.grammar.fill_bitmask(reqs) if self.grammar else None  # grammar
        logits = self.runner.forward(self.running.forward_batch(slots))
        self._sample(step, logits, self.running.info, mask, self.running.rows)
        self.running.advance()
        self.ratio = max(self.ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        return step

    def _sample(self, step: InflightStep, logits: torch.Tensor, info: Any, mask: Any,
                table_rows: torch.Tensor) -> None:
        """Sample on the device; the ids become the next decode inputs (by request row) and
        start their copy to the host."""
        vocab_mask = mask.result() if mask is not None else None  # grammar: filled meanwhile
        ids = self.sampler.sample_ids(logits, info, vocab_mask)
        self.running.record_tokens(table_rows, ids)
        step.ids = HostIds(ids)
        if step.sync:
            step.logits, step.vocab_mask = logits, vocab_mask

    # -- reading a step's tokens ----------------------------------------------------------------
    def _read(self, step: InflightStep) -> None:
        if step is self.pending:
            self.pending = None
        live = step.live()
        if step.extend_logits is not None:
            record_prompt_logprobs(step.reqs, step.layout, step.extend_logits)
            record_forced_logprobs(step.reqs, step.layout, step.extend_logits)  # grammar
        if step.sampled:
            alive = {id(r) for r in live}
            keep = [i for i, r in enumerate(step.sampled) if id(r) in alive]
            self._append_tokens(step, step.ids.tolist(), keep)
        self._finish_and_send(live)

    # -- the running batch ----------------------------------------------------------------------
    def _append_tokens(self, step: InflightStep, ids: list[int], keep: list[int]) -> None:
        """Append the sampled tokens of the live rows ``keep``, check finish conditions, then
        update the running batch (leavers out; after a prefill, the new decoders in)."""
        reqs = [step.sampled[i] for i in keep]
        next_ids = [ids[i] for i in keep]
        check = self.checker.check
        for req, token in zip(reqs, next_ids):
            req.output_ids.append(token)
            req.finish_reason = check(req)
        if step.logits is not None:  # sync step: logits rows still valid
            rows = step.logits if len(keep) == len(ids) else step.logits[keep]
            record_output_logprobs(reqs, rows, next_ids)
        if step.vocab_mask is not None:  # grammar: advance matchers, finish, jump forward
            for req in self.grammar.after_sample(reqs, self.checker):
                req.jumped = True
        if step.mode is ForwardMode.EXTEND:
            self._join_running(step, keep)
        elif any(r.finished or r.jumped for r in reqs):
            self.running.filter([r for r in self.running.reqs if not r.finished and not r.jumped])
        self._requeue_jumped(reqs)

    def _join_running(self, step: InflightStep, keep: list[int]) -> None:
        joined = [i for i in keep if not step.sampled[i].finished and not step.sampled[i].jumped]
        if not joined:
            return
        if len(joined) != len(step.sampled):
            step.info.filter(joined)
        reqs = [step.sampled[i] for i in joined]
        for req in reqs:
            req.state = ReqState.DECODING
        self.running.merge(reqs, step.info)

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

from ..layers.upload import to_device
from ..model.forward_batch import ForwardMode
from .batch import build_extend
from .inflight import HostIds, InflightStep
from .output import record_forced_logprobs, record_output_logprobs, record_prompt_logprobs
from .req import Req, ReqState

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
        logits = self.runner.forward(batch)
        # grammar: filled while the device runs the forward
        mask = self.grammar.fill_bitmask(step.sampled) if self.grammar else None
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
        if self.pending is not None and self.memory.available() < self.running.next_tokens():
            self._read(self.pending)  # requests it finished free KV: retract only if still short
        self._make_room_for_decode()
        if not self.running:
            return None
        if self.spec is not None:  # spec: a speculative step when it pays (runtime/speculative)
            step = self.spec.launch(self)
            if step is not None:
                return step
            if not self.running:  # the read of the step in flight finished every request
                return None
        reqs = self.running.reqs
        step = InflightStep.launched(ForwardMode.DECODE, reqs, self._must_sync(reqs))
        step.sampled = reqs
        fed: list[Req] = []  # grammar: jump-forward rows fed in full (their masks known now)
        # tp-step: the step graph's greedy ids (in last_token already) and their host copy
        greedy = host = None
        if self.running.forced():  # grammar: jump-forward rows feed their forced tokens
            logits, fed = self._forward_mixed(reqs)
        else:
            logits, greedy, host = self._forward_decode()
        mask = self._decode_mask(step, fed) if self.grammar else None  # grammar
        info = self.running.info
        ids = None if greedy is None else self.sampler.take_greedy(greedy, info, mask)
        if ids is not None:  # tp-step: nothing to sample, nothing to write
            self.counters["graph_ids_steps"] += 1
            self.counters["local_greedy_steps"] += logits is None
            self._keep_ids(step, logits, ids, None, host)
        else:
            assert logits is not None, "a greedy-only step's ids were not taken"
            self._sample(step, logits, info, mask, self.running.rows)
        self._apply_batch_changes()
        if self.grammar is not None and self.grammar.deferred:
            self._plan_deferred()
        self.ratio = max(self.ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        return step

    def _forward_decode(self) -> tuple[torch.Tensor, Any, Any]:
        """A plain decode step's forward; tp-step: as a whole step of the step graphs where
        they fit (model/step_graphs.py: the greedy ids and their host copy come back too,
        None otherwise)."""
        run = self.running
        graphs = getattr(self.runner, "step_graphs", None)
        whole = graphs is not None and graphs.fits(len(run))
        slots = self.memory.reserve_decode(run, device_table=not whole)
        assert slots is not None, "decode KV reservation failed after retraction"
        if whole:
            self.counters["whole_decode_steps"] += 1
            # nothing will read the logits: under TP they may stay on their ranks
            only = self.sampler.greedy_only(run.info) and not (run.grammar_rows or run.sync_rows)
            out = graphs.step(run.rows_host, run.pos_host, slots, run.shared_prefix(), only)
        else:
            out = self.runner.forward(run.forward_batch(slots)), None, None
        run.advance(device=not whole)
        return out

    def _forward_mixed(self, reqs: list[Req]) -> tuple[torch.Tensor, list[Req]]:
        """grammar: a decode step that also feeds jump-forward tokens (as decode rows: the
        graphs replay; ``RunningBatch.mixed_batch``). Returns the logits of each request's
        last fed token and the jump-forward requests fed in full; the others feed the rest
        next step and this step's token for them is dropped."""
        graphs = getattr(self.runner, "cuda_graph_runner", None)
        # within the graphs' size, unless the batch runs eager anyway
        max_rows = graphs.max_bs if graphs is not None and len(reqs) <= graphs.max_bs else None
        fed = [r for r in reqs if r.pending_forced]
        batch, last, partial = self.running.mixed_batch(self.memory, max_rows)
        logits = self.runner.forward(batch).index_select(0, last)
        for req in partial:
            req.epoch += 1
        return logits, [r for r in fed if not r.pending_forced]

    def _decode_mask(self, step: InflightStep, fed: list[Req]) -> torch.Tensor | None:
        """grammar: the bitmask of a decode step whose forward is already queued. With
        overlap, the previous step is read first (its tokens advance the matchers) while the
        device runs this forward; changes to the running batch wait until this step sampled,
        and rows whose request left meanwhile stay open (their tokens are dropped). ``fed``:
        jump-forward rows this step fed in full, whose rows are filled during the read."""
        if not self.running.grammar_rows:
            return None
        prefetch = None
        if self.pending is not None:
            self._batch_changes = []
            # the rows with nothing else to do get accepted and filled on a helper thread
            # while the read goes on (grammar/prefetch.py)
            prefetch = self._prefetch = self.grammar.prefetch(step.reqs)
            if prefetch is not None and fed:  # not in the read: their matchers are free
                live = {id(r) for r in self.pending.live()}
                prefetch.start_fill([r for r in fed if id(r) not in live])
            try:
                self._read(self.pending)
            finally:
                self._prefetch = None
        skip = [r.epoch != e for r, e in zip(step.reqs, step.epochs)]
        return self.grammar.fill_bitmask(step.reqs, skip, prefetch)

    def _plan_deferred(self) -> None:
        """grammar: the completion measurements of the read's prefetched rows, made now that
        the sampling is launched; forced requests are handled as at a read."""
        reqs, forced = self.grammar.plan_deferred(self.checker)
        for req in forced:
            self._jumped(req)
        self._leave_batch(reqs)
        self._requeue_jumped(reqs)
        self._finish_and_send([r for r in reqs if r.finished])

    def _leave_batch(self, reqs: list[Req]) -> None:
        """Those of ``reqs`` that finished or jumped leave the running batch (now, or after
        the sampling launch in flight: ``_change_batch``)."""
        if any(r.finished or r.jumped for r in reqs):
            stay = [r for r in self.running.reqs if not r.finished and not r.jumped]
            self._change_batch(lambda: self.running.filter(stay))

    def _apply_batch_changes(self) -> None:
        changes, self._batch_changes = getattr(self, "_batch_changes", None), None
        for change in changes or ():
            change()

    def _change_batch(self, change: Any) -> None:
        """Run ``change`` (a running-batch update) now, or after the sampling launch in flight
        when a read happens between a decode forward and its sampling (``_decode_mask``)."""
        deferred = getattr(self, "_batch_changes", None)
        if deferred is None:
            change()
        else:
            deferred.append(change)

    def _sample(self, step: InflightStep, logits: torch.Tensor, info: Any,
                vocab_mask: torch.Tensor | None, table_rows: torch.Tensor) -> None:
        """Sample on the device; the ids become the next decode inputs (by request row) and
        start their copy to the host. grammar: ``vocab_mask`` goes up without blocking."""
        if vocab_mask is not None:
            vocab_mask = to_device(vocab_mask, self.device)
        ids = self.sampler.sample_ids(logits, info, vocab_mask)
        self.running.record_tokens(table_rows, ids)
        self._keep_ids(step, logits, ids, vocab_mask)

    def _keep_ids(self, step: InflightStep, logits: torch.Tensor, ids: torch.Tensor,
                  vocab_mask: torch.Tensor | None, host: Any = None) -> None:
        """The step's sampled ids start their copy to the host (``host``: on their way
        already, tp-step's ring); what reading it needs."""
        step.ids = host if host is not None else HostIds(ids)
        step.vocab_mask = vocab_mask  # grammar: its rows advance their matchers when read
        if step.sync:
            step.logits = logits

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
        if self.spec is not None and step.mode is ForwardMode.DECODE:
            for req in reqs:  # spec: a plain decode step of a speculative engine
                req.spec_verify_ct += 1
        if step.logits is not None:  # sync step: logits rows still valid
            rows = step.logits if len(keep) == len(ids) else step.logits[keep]
            record_output_logprobs(reqs, rows, next_ids)
        if step.vocab_mask is not None:  # grammar: advance matchers, finish, jump forward
            batch = max(len(self.running), len(reqs))
            prefetch = getattr(self, "_prefetch", None)
            for req in self.grammar.after_sample(reqs, self.checker, batch, prefetch):
                self._jumped(req)
        if step.mode is ForwardMode.EXTEND:
            if self.pd is not None:  # pd: on a prefill server the KV goes to a decode server
                self.pd.prefilled(reqs)
            joined = [i for i in keep if not step.sampled[i].finished
                      and not step.sampled[i].jumped
                      and not (self.pd and self.pd.holds(step.sampled[i]))]  # pd
            if joined:
                self._change_batch(lambda: self._join_running(step, joined))
        else:
            self._leave_batch(reqs)
        self._requeue_jumped(reqs)

    def _jumped(self, req: Req) -> None:
        """grammar: ``req`` took a jump-forward (its forced tokens have no KV). It keeps its
        place in the batch and its KV, and its next step feeds them (``pending_forced``); a
        request whose sampling state follows every output token (logprobs owed for the forced
        tokens, penalties) goes back to the queue for an extend instead (``jumped``)."""
        params = req.sampling_params
        if req.return_logprob or params.has_penalties:
            req.jumped = True
            return
        # NOTE: a step launched before this read sampled a token after the replaced or
        # superseded one: the epoch drops it, and the replaced token's KV goes.
        req.epoch += 1
        if req.jump_kv_valid:
            self.memory.truncate(req, req.jump_kv_valid)
            req.jump_kv_valid = 0
        req.pending_forced = True

    def _join_running(self, step: InflightStep, joined: list[int]) -> None:
        if len(joined) != len(step.sampled):
            step.info.filter(joined)
        reqs = [step.sampled[i] for i in joined]
        for req in reqs:
            req.state = ReqState.DECODING
        self.running.merge(reqs, step.info)

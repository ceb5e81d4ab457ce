"""The scheduler: continuous batching over one model runner.

Each ``step`` runs one forward: a prefill (extend) batch when the adder admits anything (new
requests, the next chunk of a long prompt, retracted requests resuming), else one decode step of
every running request. After the forward it samples, checks finish conditions, frees finished
requests' KV into the radix cache and emits one ``BatchTokenOut``. When KV runs out during decode,
the least advanced requests are retracted: their KV goes to the cache, they return to the queue
and later resume from prompt + output so far, producing the same tokens.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..cache.radix import RadixCache
from ..errors import InvalidRequestError
from ..ipc import messages as m
from .batch import build_decode, build_extend
from .finish import FinishChecker
from .memory import KVMemory
from .policy import SchedulePolicy
from .prefill import PrefillAdder
from .req import Req, ReqState
from .output import make_out, record_output_logprobs, record_prompt_logprobs
from .sample_step import BatchSampler

# NOTE: share of a running request's remaining tokens that admission keeps free for its decode.
# Starts cautious, decays as decode proceeds without trouble, jumps back up after a retraction.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001


class Scheduler:
    def __init__(self, runner: Any, config: Any, eos_token_ids: Sequence[int],
                 decode: Callable[[list[int]], str] | None,
                 send: Callable[[Any], None], init_new_token_ratio: float = INIT_NEW_TOKEN_RATIO,
                 grammar: Any = None) -> None:
        self.runner = runner
        self.device = runner.token_kv_pool.device
        self.tree = RadixCache(runner.token_kv_pool, disable=config.disable_radix_cache)
        self.memory = KVMemory(runner.req_to_token_pool, runner.token_kv_pool, self.tree)
        self.policy = SchedulePolicy(config.schedule_policy, self.memory)
        self.checker = FinishChecker(eos_token_ids, decode)
        self.send = send
        self.max_running = min(config.max_running_requests, runner.req_to_token_pool.size)
        self.chunk_size = config.chunked_prefill_size
        self.init_ratio = init_new_token_ratio
        self.ratio = init_new_token_ratio
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None
        self.sampler = BatchSampler(eos_token_ids, config.seed, self.device)
        self.running_info: Any = None  # SamplingBatchInfo, rows aligned with self.running
        self.grammar = grammar  # grammar: runtime.grammar.GrammarManager or None (constraints off)
        self._arrivals = 0
        self.counters = dict(requests_total=0, prompt_tokens_total=0, generated_tokens_total=0,
                             cache_hit_tokens=0, cache_query_tokens=0, retractions_total=0,
                             forward_steps=0)

    # -- messages -----------------------------------------------------------------------------
    def handle(self, msg: Any) -> None:
        if isinstance(msg, m.TokenizedGenerateReq):
            self._arrivals += 1
            req = Req(msg.rid, msg.input_ids, msg.sampling_params, msg.return_logprob,
                      msg.logprob_start_len, msg.top_logprobs_num, self._arrivals,
                      msg.stream)
            self.counters["requests_total"] += 1
            if not self._admit_grammar(req):  # grammar: compiling requests wait aside
                self.waiting.append(req)
        elif isinstance(msg, m.AbortReq):
            self.abort(msg.rid, msg.message)
        elif isinstance(msg, m.FlushCacheReq):
            ok = self.is_idle and self.memory.flush()
            self.send(m.RpcResp(msg.call_id, ok=True, value=bool(ok)))
        elif isinstance(msg, m.StatsReq):
            self.send(m.RpcResp(msg.call_id, ok=True, value=self.stats()))
        elif isinstance(msg, m.CheckIntegrityReq):
            self.send(self._integrity_resp(msg.call_id))
        else:
            raise TypeError(f"scheduler got an unknown message {type(msg).__name__}")

    def _integrity_resp(self, call_id: int) -> m.RpcResp:
        try:
            assert self.is_idle, (f"not idle: {len(self.running)} running, "
                                  f"{len(self.waiting)} waiting, chunked={self.chunked}")
            self.memory.check_idle()
        except AssertionError as exc:
            return m.RpcResp(call_id, ok=False, error=str(exc) or repr(exc))
        return m.RpcResp(call_id, ok=True)

    @property
    def is_idle(self) -> bool:
        return (not self.waiting and not self.running and self.chunked is None
                and not (self.grammar and self.grammar.pending))

    def stats(self) -> dict:
        c = self.counters
        q = c["cache_query_tokens"]
        return {"num_running_reqs": len(self.running) + (self.chunked is not None),
                "num_waiting_reqs": len(self.waiting), "kv_total_slots": self.memory.total_slots,
                "kv_free_slots": self.memory.kv_pool.available(),
                "kv_evictable_slots": self.memory.evictable(),
                "cache_hit_rate": c["cache_hit_tokens"] / q if q else 0.0, **c,
                **(self.grammar.stats_dict() if self.grammar else {})}  # grammar

    # -- abort --------------------------------------------------------------------------------
    def abort(self, rid: str, message: str) -> None:
        """Abort wherever the request is: waiting, mid-chunked-prefill or decoding."""
        req = next((r for r in self.waiting if r.rid == rid), None)
        if req is not None:
            self.waiting.remove(req)
        elif self.grammar and (req := self.grammar.remove(rid)) is not None:
            pass  # grammar: aborted while its grammar compiled
        elif self.chunked is not None and self.chunked.rid == rid:
            req, self.chunked = self.chunked, None
        else:
            req = next((r for r in self.running if r.rid == rid), None)
            if req is None:
                return  # already finished (or never arrived): nothing to free
            self._set_running([r for r in self.running if r is not req])
        self.memory.release(req)
        req.finish_reason = {"type": "abort", "message": message}
        req.state = ReqState.FINISHED
        self.send(m.BatchTokenOut([make_out(req)]))

    # -- the step -----------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one forward if there is work; False when idle."""
        self._poll_grammars()
        reqs = self._schedule_prefill()
        if reqs:
            self._run_extend(reqs)
        elif self.running:
            self._run_decode()
        elif self.grammar and self.grammar.pending:
            self.grammar.wait_pending(0.005)  # grammar: only compiles in flight; do not spin
            return True
        else:
            return False
        self.counters["forward_steps"] += 1
        return True

    def _schedule_prefill(self) -> list[Req]:
        if not self.waiting and self.chunked is None:
            return []
        adder = PrefillAdder(self.memory, self.chunk_size, self.max_running - len(self.running),
                             self.running, self.ratio)
        if self.chunked is not None and not adder.add_chunked(self.chunked):
            return []
        for req in self.policy.order(self.waiting):
            if not adder.add(req):
                break
        for req in adder.reqs:
            if not req.counted:  # first admission: cache statistics of the prompt
                req.counted = True
                self.counters["cache_hit_tokens"] += req.cached_tokens
                self.counters["cache_query_tokens"] += req.prompt_len
                self.counters["prompt_tokens_total"] += req.prompt_len
        admitted = {id(r) for r in adder.reqs}
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        self.chunked = adder.chunked
        return adder.reqs

    def _run_extend(self, reqs: list[Req]) -> None:
        batch, layout = build_extend(reqs, self.device)
        sampling = [r for r in reqs if r.kv_len + r.extend_len >= r.seq_len
                    and not r.is_prefill_only]
        mask = self.grammar.fill_bitmask(sampling) if self.grammar else None  # grammar
        logits = self.runner.forward(batch)
        for req in reqs:
            req.kv_len += req.extend_len
            req.extend_len, req.extend_slots = 0, req.extend_slots[:0]
        record_prompt_logprobs(reqs, layout, logits)
        sample_idx = []
        for i, req in enumerate(reqs):
            if req.is_prefill_only and req.kv_len == req.seq_len:
                req.finish_reason = {"type": "length", "length": 0}
                continue
            # NOTE: cache what was computed right away (not only at the end), so a chunk is
            # protected from eviction and waiting requests sharing this prompt reuse it.
            self.memory.cache_chunk(req)
            if req.kv_len == req.seq_len:
                sample_idx.append(i)
        done = [reqs[i] for i in sample_idx]
        if done:
            rows = torch.tensor([layout.last_row(i) for i in sample_idx], device=logits.device)
            info = self.sampler.new_info(done, logits.shape[-1])
            self._append_tokens(done, logits.index_select(0, rows), info, mask)
            self._join_running(done, info)
        self._finish_and_send(reqs)

    def _run_decode(self) -> None:
        self._make_room_for_decode()
        reqs = self.running
        slots = self.memory.reserve_decode(reqs)
        assert slots is not None, "decode KV reservation failed after retraction"
        mask = self.grammar.fill_bitmask(reqs) if self.grammar else None  # grammar
        logits = self.runner.forward(build_decode(reqs, slots, self.device))
        for req in reqs:
            req.kv_len += 1
            req.extend_len, req.extend_slots = 0, req.extend_slots[:0]
        self._append_tokens(reqs, logits, self.running_info, mask)
        self._set_running([r for r in reqs if not r.finished and not r.jumped])
        self._requeue_jumped(reqs)
        self.ratio = max(self.ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        self._finish_and_send(reqs)

    # -- retraction ---------------------------------------------------------------------------
    def _make_room_for_decode(self) -> None:
        """Retract requests until every running one can get its next KV slot."""
        while self.memory.available() < len(self.running):
            if self.chunked is not None:
                victim, self.chunked = self.chunked, None
            elif len(self.running) > 1:
                victim = max(self.running, key=lambda r: (r.arrival, -len(r.output_ids)))
                self._set_running([r for r in self.running if r is not victim])
            else:
                raise RuntimeError("KV pool too small for a single request (validation missed it)")
            self.memory.release(victim)
            victim.state = ReqState.WAITING
            victim.num_retractions += 1
            self.waiting.append(victim)
            self.counters["retractions_total"] += 1
            self.ratio = max(self.ratio, self.init_ratio)

    # -- the running batch ------------------------------------------------------------------------
    def _set_running(self, reqs: list[Req]) -> None:
        """Shrink the running batch to ``reqs`` (a sub-list, in order), keeping sampling rows aligned."""
        if len(reqs) != len(self.running) and self.running_info is not None:
            pos = {id(r): i for i, r in enumerate(self.running)}
            self.running_info.filter([pos[id(r)] for r in reqs])
        self.running = reqs
        if not reqs:
            self.running_info = None

    def _join_running(self, reqs: list[Req], info: Any) -> None:
        keep = [i for i, r in enumerate(reqs) if not r.finished and not r.jumped]
        self._requeue_jumped(reqs)  # grammar
        if not keep:
            return
        if len(keep) != len(reqs):
            info.filter(keep)
        for i in keep:
            reqs[i].state = ReqState.DECODING
            self.running.append(reqs[i])
        if self.running_info is None:
            self.running_info = info
        else:
            self.running_info.merge(info)

    # -- sampling, logprobs, outputs ----------------------------------------------------------------
    def _append_tokens(self, reqs: list[Req], logits: torch.Tensor, info: Any,
                       mask: Any = None) -> None:
        vocab_mask = mask.result() if mask is not None else None  # grammar: filled during forward
        next_ids = self.sampler.sample(logits, info, vocab_mask)
        record_output_logprobs(reqs, logits, next_ids)
        for req, token in zip(reqs, next_ids):
            req.output_ids.append(token)
            req.finish_reason = self.checker.check(req)
        if vocab_mask is not None:  # grammar: advance matchers, finish, jump forward
            for req in self.grammar.after_sample(reqs, self.checker):
                req.jumped = True

    # -- grammar (runtime/grammar/manager.py does the work) -------------------------------------
    def _admit_grammar(self, req: Req) -> bool:
        """True if ``req`` waits for its grammar; a bad grammar finishes it with an error."""
        if req.sampling_params.constraint is None:
            return False
        if self.grammar is None:  # never run a constrained request unconstrained
            self._fail_invalid(req, InvalidRequestError(
                "constraints are disabled on this engine (grammar_backend='none')",
                field=req.sampling_params.constraint[0]))
            return True
        try:
            return self.grammar.admit(req)
        except InvalidRequestError as e:
            self._fail_invalid(req, e)
            return True

    def _poll_grammars(self) -> None:
        if not (self.grammar and self.grammar.pending):
            return
        ready, failed = self.grammar.poll()
        self.waiting.extend(ready)
        for req, err in failed:
            self._fail_invalid(req, err)

    def _fail_invalid(self, req: Req, err: InvalidRequestError) -> None:
        """Finish before any KV was allocated; the main process raises it as a 400."""
        req.finish_reason = {"type": "abort", "message": err.message, "status": err.status,
                             "field": err.field}
        req.state = ReqState.FINISHED
        self.send(m.BatchTokenOut([make_out(req)]))

    def _requeue_jumped(self, reqs: list[Req]) -> None:
        """Jump-forward appended tokens without KV: back to the queue for an extend (the
        prefix with KV goes to the radix cache, as on retraction)."""
        for req in reqs:
            if req.jumped:
                req.jumped = False
                if req.finished:
                    continue
                self.memory.release(req)
                req.state = ReqState.WAITING
                self.waiting.append(req)

    def _finish_and_send(self, reqs: list[Req]) -> None:
        outs = []
        for req in reqs:
            if req.finished:
                req.state = ReqState.FINISHED
                self.memory.release(req)
                self.counters["generated_tokens_total"] += len(req.output_ids)
            if req.finished or (req.stream and req.output_ids[req.sent_ids:]):
                outs.append(make_out(req))
        if outs:
            self.send(m.BatchTokenOut(outs))

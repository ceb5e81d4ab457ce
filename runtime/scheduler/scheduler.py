"""The scheduler: continuous batching over one model runner.

Each ``step`` launches one forward: a prefill (extend) batch when the adder admits anything (new
requests, the next chunk of a long prompt, retracted requests resuming), else one decode step of
the running batch; sampling is queued with it on the device. Reading a step's tokens (append,
finish checks, freeing finished requests' KV into the radix cache, one ``BatchTokenOut``) happens
right after it, or, with overlap scheduling, after the next step was launched (``inflight.py``).
When KV runs out during decode, the least advanced requests are retracted: their KV goes to the
cache, they return to the queue and later resume from prompt + output so far, producing the same
tokens.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ..cache.hicache.factory import make_tree  # hicache:
from ..errors import InvalidRequestError, OverloadedError
from ..grammar.base import bitmask_width
from ..layers.bitmask import warm_up_fused
from ..ipc import messages as m
from ..model.forward_batch import ForwardMode
from ..multimodal.embed import mm_stats
from .finish import FinishChecker
from .inflight import InflightStep
from .memory import KVMemory
from .output import make_out
from .policy import SchedulePolicy
from .prefill import PrefillAdder
from .req import Req, ReqState
from .running import RunningBatch, needs_sync
from .sample_step import BatchSampler
from .stepping import Stepping
from ..disaggregation import make_pd  # pd:
from ..disaggregation.shards import Events, Verdicts  # pd:
from . import tp_sync
from .. import hop_times  # hops: per-chunk timestamps ($SGDSL_HOP_TIMES)

# NOTE: share of a running request's remaining tokens that admission keeps free for its decode.
# Starts cautious, decays as decode proceeds without trouble (stepping.py), jumps back up after
# a retraction.
INIT_NEW_TOKEN_RATIO = 0.7
PD_POLL_S = 0.002  # pd: the loop's pace while only KV transfers are in flight


class Scheduler(Stepping):
    def __init__(self, runner: Any, config: Any, eos_token_ids: Sequence[int],
                 decode: Callable[[list[int]], str] | None,
                 send: Callable[[Any], None], init_new_token_ratio: float = INIT_NEW_TOKEN_RATIO,
                 grammar: Any = None) -> None:
        self.runner = runner
        self.device = runner.token_kv_pool.device
        self.tree = make_tree(runner, config)  # hicache: tiered when enable_hierarchical_cache
        self.memory = KVMemory(runner.req_to_token_pool, runner.token_kv_pool, self.tree)
        self.policy = SchedulePolicy(config.schedule_policy, self.memory)
        self.checker = FinishChecker(eos_token_ids, decode)
        self.send = send
        self.max_running = min(config.max_running_requests, runner.req_to_token_pool.size)
        self.chunk_size = config.chunked_prefill_size
        self.init_ratio = init_new_token_ratio
        self.ratio = init_new_token_ratio
        self.waiting: list[Req] = []
        self.running = RunningBatch(
            self.device, runner.req_to_token_pool.size, self.tree,
            getattr(getattr(runner, "attn_backend", None), "prefix_members", None),
            getattr(runner, "last_token", None))  # tp-step: the step graphs read it
        self.chunked: Req | None = None
        self.sampler = BatchSampler(eos_token_ids, config.seed, self.device)
        self.overlap = not config.disable_overlap_schedule
        self.pending: InflightStep | None = None  # launched, tokens not read yet (overlap)
        self.grammar = grammar  # grammar: runtime.grammar.GrammarManager or None (constraints off)
        if grammar is not None:  # grammar: masks go to the GPU from pinned memory, unblocked
            grammar.pin_memory = self.device.type == "cuda"
            logits_width = getattr(getattr(runner, "model_config", None), "vocab_size", None)
            warm_up_fused(self.device, int(logits_width or grammar.vocab_size),
                          bitmask_width(grammar.vocab_size))
        self._arrivals = 0
        # spec: speculative decoding (runtime/speculative) when an algorithm is configured
        self.spec = None
        if getattr(config, "speculative_algorithm", None):
            from ..speculative.decoder import SpecDecoder

            self.spec = SpecDecoder(config, runner)
        self.counters = dict(requests_total=0, prompt_tokens_total=0, generated_tokens_total=0,
                             cache_hit_tokens=0, cache_query_tokens=0, retractions_total=0,
                             forward_steps=0, extend_steps=0,
                             # tp-step: decode steps run whole by the step graphs, those
                             # whose ids were the graph's greedy ones (nothing sampled after),
                             # and of these the ones picked without the logits' all-gather
                             whole_decode_steps=0, graph_ids_steps=0, local_greedy_steps=0)
        self.pd = make_pd(config, self)  # pd: prefill or decode side of disaggregation, or None

    # -- messages -----------------------------------------------------------------------------
    def handle(self, msg: Any) -> None:
        if isinstance(msg, m.TokenizedGenerateReq):
            self._arrivals += 1
            req = Req(msg.rid, msg.input_ids, msg.sampling_params, msg.return_logprob,
                      msg.logprob_start_len, msg.top_logprobs_num, self._arrivals,
                      msg.stream)
            req.mm = msg.mm  # mm:
            if self.pd is not None and req.max_new_tokens > 0:  # pd: paired with another server
                req.pd_bootstrap = msg.bootstrap
            self.counters["requests_total"] += 1
            if self.spec is not None:  # spec: meta_info counts its verify steps
                req.spec_verify_ct = 0
            if not self._admit_grammar(req):  # grammar: compiling requests wait aside
                self.waiting.append(req)
        elif isinstance(msg, m.AbortReq):
            self.abort(msg.rid, msg.message)
        elif isinstance(msg, m.FlushCacheReq):
            ok = self.is_idle and self.memory.flush()
            self.send(m.RpcResp(msg.call_id, ok=True, value=bool(ok)))
        elif isinstance(msg, m.StatsReq):
            self.send(m.RpcResp(msg.call_id, ok=True, value=self.stats()))
        elif isinstance(msg, m.PrecompileReq):  # grammar: answered once compiled (step)
            self._precompile(msg)
        elif isinstance(msg, (Verdicts, Events)):  # pd: rank 0's KV transfer decisions (tp)
            self.pd.apply(msg)
        elif isinstance(msg, m.CheckIntegrityReq):  # every TP rank checks, rank 0 answers
            self.send(tp_sync.integrity_resp(msg.call_id, self._integrity_resp(msg.call_id)))
        else:
            raise TypeError(f"scheduler got an unknown message {type(msg).__name__}")

    def _integrity_resp(self, call_id: int) -> m.RpcResp:
        try:
            assert self.is_idle, (f"not idle: {len(self.running)} running, "
                                  f"{len(self.waiting)} waiting, chunked={self.chunked}")
            self.memory.check_idle()
            problems = self.spec.check_idle() if self.spec is not None else []  # spec:
            assert not problems, "; ".join(problems)
            if self.pd is not None:  # pd: no transfer in flight, no KV held for one
                self.pd.check_idle()
        except AssertionError as exc:
            return m.RpcResp(call_id, ok=False, error=str(exc) or repr(exc))
        return m.RpcResp(call_id, ok=True)

    @property
    def is_idle(self) -> bool:
        return (not self.waiting and not self.running and self.chunked is None
                and self.pending is None and not (self.grammar and self.grammar.pending)
                and not (self.pd and self.pd.busy))  # pd

    def stats(self) -> dict:
        c = self.counters
        q = c["cache_query_tokens"]
        return {"num_running_reqs": len(self.running) + (self.chunked is not None),
                "num_waiting_reqs": len(self.waiting), "kv_total_slots": self.memory.total_slots,
                "kv_free_slots": self.memory.kv_pool.available(),
                "kv_evictable_slots": self.memory.evictable(),
                "cache_hit_rate": c["cache_hit_tokens"] / q if q else 0.0, **c,
                **self._work_left(), **mm_stats(self.runner),  # mm:
                **getattr(self.tree, "hicache_stats", dict)(),  # hicache
                **(self.grammar.stats_dict() if self.grammar else {}),  # grammar
                **(self.spec.stats_dict() if self.spec is not None else {}),  # spec
                **(self.pd.stats() if self.pd else {})}  # pd

    def _work_left(self) -> dict:
        """Tokens still to compute, for a router balancing by work (``GET /load``): prompt
        tokens waiting for prefill (less the cached prefix the last queue pass found) and output
        tokens still to decode (up to each request's max_new_tokens). O(queue), no tree walks."""
        prefill = sum(max(r.seq_len - r.match_len, 0) for r in self.waiting)
        if self.chunked is not None:
            prefill += self.chunked.seq_len - self.chunked.kv_len
        reqs = [*self.waiting, *self.running.reqs, *([self.chunked] if self.chunked else [])]
        return {"queued_prefill_tokens": prefill,
                "remaining_decode_tokens": sum(r.remaining_tokens for r in reqs),
                "running_kv_tokens": sum(r.kv_len for r in self.running.reqs)}

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
        elif (req := next((r for r in self.running.reqs if r.rid == rid), None)) is not None:
            self.running.filter([r for r in self.running.reqs if r is not req])
        elif self.pd is not None and (req := self.pd.remove(rid, message)) is not None:
            pass  # pd: held for (or waiting for) a KV transfer
        else:  # prefilled by the step in flight (its token is then dropped: epoch)
            live = self.pending.live() if self.pending is not None else []
            req = next((r for r in live if r.rid == rid and not r.finished), None)
            if req is None:
                return  # already finished (or never arrived): nothing to free
        self.memory.release(req)
        self._spec_release(req)
        if self.pending is not None and not self.pending.live():
            self.pending = None  # nothing left to read from the step in flight
        req.finish_reason = {"type": "abort", "message": message}
        req.state = ReqState.FINISHED
        self.send(m.BatchTokenOut([make_out(req)]))

    # -- the step -----------------------------------------------------------------------------
    def step(self) -> bool:
        """Launch one forward if there is work and read the previous one; False when idle.

        With overlap on, step t's tokens are read after step t+1 was launched (the device runs
        t+1 while the host does t's bookkeeping). A step whose results are needed before the
        next launch (logprobs, grammar masks) is read right away instead."""
        self._poll_grammars()
        self._poll_precompiles()
        if self.pd is not None:  # pd: registrations, finished transfers, prebuilt requests
            self.pd.poll()
        reqs = self._schedule_prefill()
        if self.pending is not None and self._must_sync(reqs or self.running.reqs):
            self._read(self.pending)
        if reqs:
            launched = self._launch_extend(reqs)
        elif self.running:
            launched = self._launch_decode()
        else:
            launched = None
        if self.pending is not None:
            self._read(self.pending)
        self.memory.issue_backups()  # hicache: this step's write-throughs, after its launch
        if launched is None:
            if self.grammar and (self.grammar.pending or self.grammar.precompiles.busy):
                self.grammar.wait_pending(0.005)  # grammar: only compiles in flight; do not spin
                return True
            if self.pd is not None and self.pd.busy:  # pd: only transfers in flight
                time.sleep(PD_POLL_S)
                return True
            # NOTE: reading the last step may have sent requests back to the queue (grammar:
            # jump-forward), which the next step runs.
            return bool(self.waiting)
        self.counters["forward_steps"] += 1
        if reqs:  # prefill waves: a burst admitted in one wave is one extend forward
            self.counters["extend_steps"] += 1
        if launched.sync:
            self._read(launched)
        elif launched.any_live():
            self.pending = launched
        # else: reading the previous step finished every request of this one; nothing to read
        return True

    def _must_sync(self, batch: list[Req]) -> bool:
        """Read the step in flight before launching ``batch``: overlap off, nothing to launch
        (the step may add decoders), or rows that need exact logits / grammar state."""
        if not self.overlap or not batch:
            return True
        if batch is self.running.reqs:
            return self.running.sync_rows > 0
        return any(map(needs_sync, batch))

    def _schedule_prefill(self) -> list[Req]:
        if not self.waiting and self.chunked is None:
            return []
        # NOTE: requests prefilled by the step in flight join the running batch when it is
        # read; they count against max_running (and reserve decode room) already.
        joining = self.pending.sampled if (self.pending is not None and
                                           self.pending.mode is ForwardMode.EXTEND) else []
        adder = PrefillAdder(self.memory, self.chunk_size,
                             self.max_running - len(self.running) - len(joining),
                             self.running.reqs + joining, self.ratio)
        early = self._pd_short_first(adder)  # pd: a prefill server runs short prompts first
        if self.chunked is not None and not adder.add_chunked(self.chunked):
            if not early:
                return []
            adder.chunked = self.chunked  # pd: the long prompt waits a round; nothing else chunks
        taken = {id(r) for r in early}
        for req in self.policy.order([r for r in self.waiting if id(r) not in taken]):
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

    def _pd_short_first(self, adder: PrefillAdder) -> list[Req]:
        """pd: on a prefill server, beside a chunked prompt, waiting short prompts first
        (disaggregation/admission.py); nothing elsewhere."""
        short_first = getattr(self.pd, "short_first", None)
        if short_first is None or self.chunked is None or not self.waiting:
            return []
        return short_first(adder, self.policy.order(self.waiting))

    # -- retraction ---------------------------------------------------------------------------
    def _make_room_for_decode(self) -> None:
        """Retract requests until every running one can get its next KV slots."""
        while self.memory.available() < self.running.next_tokens():
            if self.chunked is not None:
                victim, self.chunked = self.chunked, None
            elif len(self.running) > 1:
                victim = max(self.running.reqs, key=lambda r: (r.arrival, -len(r.output_ids)))
                self.running.filter([r for r in self.running.reqs if r is not victim])
            else:
                raise RuntimeError("KV pool too small for a single request (validation missed it)")
            self.memory.release(victim)
            self._spec_release(victim)
            victim.state = ReqState.WAITING
            victim.num_retractions += 1
            self.waiting.append(victim)
            self.counters["retractions_total"] += 1
            self.ratio = max(self.ratio, self.init_ratio)

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
        except (InvalidRequestError, OverloadedError) as e:  # overloaded: retryable, a 503
            self._fail_invalid(req, e)
            return True

    def _poll_grammars(self) -> None:
        if not (self.grammar and self.grammar.pending):
            return
        ready, failed = tp_sync.poll_grammars(self.grammar)
        self.waiting.extend(ready)
        for req, err in failed:
            self._fail_invalid(req, err)

    def _precompile(self, msg: m.PrecompileReq) -> None:
        if self.grammar is None:
            error = {"ok": False, "error": "constraints are disabled on this engine "
                     "(grammar_backend='none')", "field": "grammar_backend", "status": 400}
            self.send(m.RpcResp(msg.call_id, ok=True, value=[
                {**error, "kind": kind} for kind, _ in msg.constraints]))
            return
        self.grammar.precompiles.add(msg.call_id, msg.constraints)

    def _poll_precompiles(self) -> None:
        if self.grammar is not None and self.grammar.precompiles.busy:
            for call_id, results in self.grammar.precompiles.poll():
                self.send(m.RpcResp(call_id, ok=True, value=results))

    def _fail_invalid(self, req: Req, err: InvalidRequestError | OverloadedError) -> None:
        """Finish before any KV was allocated; the main process raises it again from the
        status (400: invalid; 503: overloaded, with its retry-after)."""
        req.finish_reason = {"type": "abort", "message": err.message, "status": err.status,
                             "field": getattr(err, "field", None)}
        if isinstance(err, OverloadedError):
            req.finish_reason["retry_after"] = err.retry_after
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

    def _spec_release(self, req: Req) -> None:
        """spec: the drafter forgets a request that finished, aborted or was retracted."""
        if self.spec is not None:
            self.spec.release(req)

    def _finish_and_send(self, reqs: list[Req]) -> None:
        outs = []
        for req in reqs:
            if self.pd is not None and self.pd.holds(req):
                continue  # pd: finishes when the decode server has its KV
            if req.finished:
                req.state = ReqState.FINISHED
                # grammar: a completed request may have dropped a token an overlapped step
                # already computed KV for; only KV under its own ids goes to the cache.
                self.memory.truncate(req, req.seq_len)
                self.memory.release(req)
                self._spec_release(req)
                self.counters["generated_tokens_total"] += len(req.output_ids)
            if req.finished or (req.stream and req.output_ids[req.sent_ids:]):
                outs.append(make_out(req))
        if outs:
            self.send(m.BatchTokenOut(outs, hop_times.now()))  # hops: stamped when debugging

"""GrammarManager: the scheduler's one handle on constrained decoding.

The scheduler calls, in order: ``admit`` when a request arrives (compilation starts in the
compiler's worker processes; the request waits in ``pending``, the "grammar pending" state, without
blocking the loop), ``poll`` each step (requests whose grammar is ready move on to the waiting
queue; failures come back with their ``InvalidRequestError``), ``fill_bitmask`` before sampling
(one packed bitmask for the batch, filled by the backend's batch call while the forward runs
on the device), and ``after_sample`` once tokens are appended (one batch accept call): it
advances each matcher, finishes requests whose grammar terminated or admits only a stop token,
and applies jump-forward and forced completions (forcing.py: forced text appended without
sampling; the scheduler feeds those tokens in the request's next decode step, one decode row
each: a mixed step). A request that returns logprobs jumps too, through the queue: it owes the
forced tokens' logprobs (``forced_logprobs_owed``), which the rows of its next extend supply;
a jump that would finish it is undone and the tokens are sampled. With overlap
scheduling, ``prefetch`` lets the rows with nothing else to do be accepted and filled on a
helper thread while the rest of the step runs (prefetch.py).

Requests need the attributes ``grammar``, ``grammar_pending`` and ``forced_logprobs_owed``
(``Req`` defines them).
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..errors import InvalidRequestError
from .base import (GrammarBackend, GrammarKey, accept_token_grouped, allocate_bitmask,
                   fill_bitmask_grouped)
from .compile_admission import Histogram
from .compiler import WARM_PROBE, GrammarCompiler
from .disk_cache import GrammarDiskCache, disk_cache_from_config
from .completion import CompletionConfig, CompletionTracker
from .worker_pool import PoolLimits
from .jump_forward import only_stop_allowed, stop_only_row
from .forcing import Forcing
from .precompile import Precompiles
from .prefetch import MaskPrefetch
from .unique_keys import build_quote_tokens, guard_keys, has_open_keys, marked_schema


@dataclass
class GrammarStats:
    """Measurements for benchmarks and /metrics."""

    mask_fill_s: list[float] = field(default_factory=list)  # per step, per constrained row
    jump_forward_tokens: int = 0
    sampled_tokens: int = 0  # tokens sampled under a grammar
    # a request's admission: from its compile's submit (limit checks included) until its
    # grammar is ready here (or failed): the wait a constrained request adds
    admission_s: Histogram = field(default_factory=Histogram)


class GrammarManager(Forcing):
    def __init__(self, backend: GrammarBackend, tokenizer: Any, vocab_size: int,
                 eos_token_ids: Sequence[int], *, timeout_s: float = 10.0,
                 jump_forward: bool = True, jump_max_batch: int | None = None,
                 completion: CompletionConfig | None = CompletionConfig(),
                 pool: PoolLimits | None = None,
                 compiler: GrammarCompiler | None = None,
                 disk_cache: GrammarDiskCache | None = None) -> None:
        # A compiler passed in (shared, e.g. by tests) is not shut down with this manager.
        self._owns_compiler = compiler is None
        self.compiler = compiler or GrammarCompiler(backend, timeout_s=timeout_s, pool=pool,
                                                    disk=disk_cache, after=self._tables)
        # warm-up batches (Engine.precompile), a few compiles at a time
        self.precompiles = Precompiles(self.compiler, 2 * self.compiler.pool_limits.workers)
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos = tuple(eos_token_ids)
        self.jump_forward = jump_forward
        # Above this many decoding requests forced text is sampled token by token (None: no
        # limit). NOTE: a jumping request stays in the decode batch, whose next step feeds
        # its forced tokens (scheduler: a mixed step), so no limit is needed by default.
        self.jump_max_batch = jump_max_batch
        self.pending: list[Any] = []
        # measurements after_sample left for plan_deferred (rows the prefetch handled)
        self.deferred: list[Any] = []
        self.quote_tokens = build_quote_tokens(tokenizer, vocab_size)
        self.stats = GrammarStats()
        # Bitmasks go to the device with a non-blocking copy, which needs pinned host memory
        # (the scheduler sets this on CUDA; torch's caching host allocator recycles them).
        self.pin_memory = False
        # complete: forced completion within the budget (completion.py); None when disabled.
        self.completion = (CompletionTracker(tokenizer, vocab_size, self.eos, completion,
                                             backend, disk_cache)
                           if completion is not None and completion.enabled else None)

    # -- admission ------------------------------------------------------------------------------
    def warm(self, timeout_s: float = 120.0) -> bool:
        """At start-up: the compile workers up and one small schema through the whole path
        (compile, load, guard), and the estimate worker starting, so the first request pays
        no start-up. False if the workers did not come up within ``timeout_s``."""
        if self.completion is not None and self.completion.jobs is not None:
            self.completion.jobs.worker.start()
        try:
            if not self.compiler.warm(timeout_s):
                return False
            grammar = self.compiler.submit(WARM_PROBE).result()  # guarded as a request's is
        except InvalidRequestError:  # a backend without JSON schemas: the workers are up
            return True
        guard_keys(grammar, WARM_PROBE, self.quote_tokens, self.compiler.backend.name)
        return True

    def admit(self, req: Any) -> bool:
        """Start compiling ``req``'s constraint; True if it now waits in ``pending``. Raises
        ``InvalidRequestError`` at once for limit violations and known-bad grammars, and
        ``GrammarQueueFullError`` (retryable) when the compile queue is too long."""
        constraint = req.sampling_params.constraint
        if constraint is None:
            return False
        req.grammar_pending = self.compiler.submit(GrammarKey.from_constraint(*constraint))
        self.pending.append(req)
        return True

    def poll(self) -> tuple[list[Any], list[tuple[Any, InvalidRequestError]]]:
        """(requests now ready to schedule, (request, error) pairs that failed)."""
        ready, failed, still = [], [], []
        now = time.monotonic()
        for req in self.pending:
            if not req.grammar_pending.ready():
                still.append(req)
                continue
            self.stats.admission_s.observe(now - req.grammar_pending.submitted)
            try:
                req.grammar = self._guard(req, req.grammar_pending.result())
                ready.append(req)
            except InvalidRequestError as e:
                failed.append((req, e))
            req.grammar_pending = None
        self.pending = still
        return ready, failed

    def take(self, outcomes: list[tuple[str, InvalidRequestError | None]]
             ) -> tuple[list[Any], list[tuple[Any, InvalidRequestError]]]:
        """``poll`` with the outcomes decided elsewhere (tensor-parallel rank 0, see
        ``scheduler/tp_sync.py``): those requests leave ``pending``, waiting for their compile
        without a deadline when it succeeded there; a failure there fails here too."""
        decided = dict(outcomes)
        ready, failed, still = [], [], []
        for req in self.pending:
            if req.rid not in decided:
                still.append(req)
            elif decided[req.rid] is not None:
                failed.append((req, decided[req.rid]))
            else:
                # the future holds (compiled, size in bytes); no deadline here: rank 0 got it
                compiled = req.grammar_pending.future().result()[0]
                req.grammar = self._guard(req, self.compiler.backend.new_grammar(compiled))
                ready.append(req)
            if req.rid in decided:
                req.grammar_pending = None
        self.pending = still
        return ready, failed

    def _tables(self, key: GrammarKey) -> None:
        """On a compile-pool thread, once ``key`` compiled: what ``_guard`` reads for it
        (the normalized schema's marks, cached), so the scheduler loop does not normalize
        the schema again (up to seconds for a large one)."""
        if key.kind in ("json_schema", "json_object"):
            has_open_keys(key.kind, key.text)
            if key.kind == "json_schema":
                marked_schema(key.text, self.compiler.backend.name)

    def _guard(self, req: Any, grammar: Any) -> Any:
        """JSON grammars get unique object keys (unique_keys.py says why a CFG cannot).
        Called once a request's grammar compiled: the completion-estimate worker compiles
        its own copy meanwhile (never before: a key that fails its deadline or memory limit
        here must not run unbounded there)."""
        key = GrammarKey.from_constraint(*req.sampling_params.constraint)
        if self.completion is not None and self.completion.may_estimate(req):
            self.completion.jobs.prepare(key)
        return guard_keys(grammar, key, self.quote_tokens, self.compiler.backend.name)

    def wait_pending(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` for a pending compile (only when nothing else can run)."""
        futures = [r.grammar_pending.future() for r in self.pending]
        futures += self.precompiles.futures()
        if futures:
            cf.wait(futures, timeout=timeout_s, return_when=cf.FIRST_COMPLETED)

    def remove(self, rid: str) -> Any | None:
        """Take a pending request out (abort); None if it is not pending."""
        for req in self.pending:
            if req.rid == rid:
                self.pending.remove(req)
                return req
        return None

    # -- per step -------------------------------------------------------------------------------
    def prefetch(self, reqs: Sequence[Any]) -> MaskPrefetch | None:
        """A prefetch for the decode step of ``reqs`` whose tokens are read next (prefetch.py),
        or None when no row's grammar can be handed to a helper thread."""
        if not any(r.grammar is not None and r.grammar.thread_safe_batch for r in reqs):
            return None
        return MaskPrefetch(reqs, self.vocab_size, pin=self.pin_memory)

    def fill_bitmask(self, reqs: Sequence[Any], skip: Sequence[bool] | None = None,
                     prefetch: MaskPrefetch | None = None) -> torch.Tensor | None:
        """The batch bitmask (rows aligned with ``reqs``; unconstrained rows allow every
        token), or None when no row is constrained. ``skip[i]``: row i's result will be
        dropped (its request finished or left since the step launched), leave it open.
        ``prefetch``: the step's prefetch, whose filled rows are kept.

        Rows are filled per grammar class in one native batch call (xgrammar: its own thread
        pool); the caller overlaps this with the forward already queued on the device."""
        rows = [i for i, req in enumerate(reqs) if req.grammar is not None and not req.finished
                and not (skip is not None and skip[i])]
        todo = rows if prefetch is None else prefetch.settle(rows)
        if not rows:
            return None
        t0 = time.perf_counter()
        bitmask = (allocate_bitmask(len(reqs), self.vocab_size, pin=self.pin_memory)
                   if prefetch is None else prefetch.bitmask)
        fill_bitmask_grouped([reqs[i].grammar for i in todo], bitmask, todo)
        self.stats.mask_fill_s.append((time.perf_counter() - t0) / len(rows))
        del self.stats.mask_fill_s[:-1024]  # a window, not a leak
        return bitmask

    def after_sample(self, reqs: Sequence[Any], checker: Any, batch_size: int = 1,
                     prefetch: MaskPrefetch | None = None) -> list[Any]:
        """Advance matchers by each request's newest token (one batch call per grammar class);
        returns the requests that took forced tokens (jump-forward, a forced completion) and
        are still running: their tokens have no KV yet. ``batch_size``: requests decoding now (jump-forward only up to
        ``jump_max_batch``). ``prefetch``: the next step's (see ``prefetch``); rows with
        nothing else to do this step are accepted and filled there, on a helper thread, and
        the others' rows are filled here as soon as they are advanced, while that job runs;
        the handed rows' completion measurements are left for ``plan_deferred``, which the
        caller runs once the step's sampling is launched."""
        jump = self.jump_forward and (
            self.jump_max_batch is None or batch_size <= self.jump_max_batch)
        live = [r for r in reqs if r.grammar is not None and not (
            r.finished and r.finish_reason.get("type") == "abort")]
        handed = [] if prefetch is None else [r for r in live if self._can_hand(r, prefetch)]
        if handed:
            prefetch.start(handed, jump)
            ids = {id(r) for r in handed}
            kept = [r for r in live if id(r) not in ids]
        else:
            kept = live
        self.stats.sampled_tokens += len(live)
        # (request, its jump-forward text or None: not asked yet), jumped at the end
        jumpers: list[tuple[Any, str | None]] | None = [] if jump else None
        requeue = self._advance(kept, checker, jumpers)
        if handed:
            back = {id(r) for r in requeue}
            prefetch.fill([r for r in kept if not r.finished and id(r) not in back])
            requeue += self._advance_handed(handed, prefetch, checker, jumpers)
        elif jumpers:
            requeue += self._jump_batch(jumpers, checker)
        return requeue

    def _can_hand(self, req: Any, prefetch: MaskPrefetch) -> bool:
        """Whether ``req``'s matcher has nothing to do before the sampling launch but accept
        and fill (a completion measurement due is made after it: ``plan_deferred``)."""
        return (req.grammar.thread_safe_batch and not req.finished and prefetch.covers(req)
                and not (req.completion is not None and req.completion.finishing))

    def plan_deferred(self, checker: Any) -> tuple[list[Any], list[Any]]:
        """The completion measurements ``after_sample`` deferred (rows the prefetch accepted
        and filled), made once the step's sampling is launched: (the requests measured, those
        of them forced that must go back to the queue for an extend; the others forced are
        finished). A request forced here leaves the batch like one finished by the read: the
        token sampled for it meanwhile is dropped.

        NOTE: made after the launch rather than before it, this Python work (~1.3 ms at 256
        rows on the H100 host) takes the host's idle time while the device samples, instead
        of delaying the sampling launch; made beside the prefetch job it delayed the job's
        own GIL turns (after_sample 9.1-11.2 ms against 8.9-10.2 after the job)."""
        reqs, self.deferred = self.deferred, []
        requeue = []
        for req in reqs:
            if req.finished or not self.completion.due(req):
                continue
            plan = self.completion.plan(req, req.grammar)
            if plan is not None and self._force(req, req.grammar, plan, checker, final=True):
                requeue.append(req)
        return reqs, requeue

    def _advance_handed(self, handed: list[Any], prefetch: MaskPrefetch, checker: Any,
                        jumpers: list | None) -> list[Any]:
        """``_advance`` for the rows the prefetch accepted, from its ``RowFacts``; then the
        jump-forwards (``jumpers``, with the kept rows') while the job fills the other rows.
        A complete value is decided once its row is filled (only a stop token left?).
        Returns the requests that took forced tokens and are still running."""
        requeue, complete = [], []
        for req, facts in zip(handed, prefetch.result()):
            if not facts.ok:
                req.finish_reason = {"type": "abort",
                                     "message": "the sampled token does not fit the grammar"}
            elif facts.terminated:
                self._finish_with_stop(req, req.grammar)
            elif facts.completed:  # filled even with a jump text: decided once filled
                complete.append((req, facts))
            elif self._decide(req, facts.jump, checker, jumpers):
                requeue.append(req)
        if jumpers:
            requeue += self._jump_batch(jumpers, checker)
        prefetch.wait_filled()
        if not complete:
            return requeue
        late: list | None = None if jumpers is None else []
        for req, facts in complete:
            if not req.return_logprob and stop_only_row(prefetch.row(req), self.vocab_size,
                                                        self.eos):
                self._finish_with_stop(req, req.grammar)
            elif self._decide(req, facts.jump, checker, late):
                requeue.append(req)
        return requeue + (self._jump_batch(late, checker) if late else [])

    def _decide(self, req: Any, text: str, checker: Any, jumpers: list | None) -> bool:
        """A handed row still running: it jumps forward where its grammar forces ``text``,
        and a completion measurement due waits for the sampling launch (``deferred``). True
        if forced tokens were appended to a request still running.

        NOTE: measured after its jump, a request forced to complete finishes as well as
        before it: every completion starts with the forced text, so the jump shortens the
        budget and the completion alike. Not where the jump could use up the budget, nor for
        a request owing logprobs (its forced tokens are scored by an extend, whose
        bookkeeping a second forcing would overwrite): those are measured first, as the
        jump must come before the read's stream output (it may respell the last token)."""
        if not (self.completion and self.completion.due(req)):
            if jumpers is not None and text:
                jumpers.append((req, text))
            return False
        if jumpers is None or not text:
            self.deferred.append(req)
            return False
        budget = req.sampling_params.max_new_tokens - len(req.output_ids)
        if req.return_logprob or budget <= len(text) + 1:
            return self._settle(req, req.grammar, checker, jumpers, text)
        jumpers.append((req, text))
        self.deferred.append(req)
        return False

    def _advance(self, live: list[Any], checker: Any, jumpers: list[Any] | None) -> list[Any]:
        accepted = accept_token_grouped([r.grammar for r in live],
                                        [r.output_ids[-1] for r in live])
        requeue = []
        for req, ok in zip(live, accepted):
            grammar = req.grammar
            if not ok:
                if not req.finished:  # a length-finished last token needs no acceptance
                    req.finish_reason = {"type": "abort", "message":
                                         "the sampled token does not fit the grammar"}
                continue
            if req.completion is not None and req.completion.finishing and (  # complete
                    req.output_ids[-1] not in self.eos):
                self._end_completed(req, grammar)
                continue
            if req.finished:
                continue
            # NOTE: a request returning logprobs samples its stop token (it needs its logprob)
            # rather than having it appended.
            if grammar.is_terminated() or not req.return_logprob and only_stop_allowed(
                    grammar, self.vocab_size, self.eos):
                self._finish_with_stop(req, grammar)
            elif self._settle(req, grammar, checker, jumpers):
                requeue.append(req)
        return requeue

    def _settle(self, req: Any, grammar: Any, checker: Any, jumpers: list | None,
                text: str | None = None) -> bool:
        """A forced completion when one is due (completion.py; True if its tokens were
        appended to a request still running), else the request joins ``jumpers`` (None:
        jump-forward off; ``text``: its jump-forward text if known), whose jump-forwards are
        made in one batch (``_jump_batch``)."""
        if self.completion and self.completion.due(req) and (
                plan := self.completion.plan(req, grammar)) is not None:
            return self._force(req, grammar, plan, checker, final=True)
        if jumpers is not None:
            jumpers.append((req, text))
        return False

    def stats_dict(self) -> dict:
        """Counters for ``Engine.stats()``."""
        return {"grammar_pending_reqs": len(self.pending),
                "grammar_sampled_tokens": self.stats.sampled_tokens,
                "grammar_jump_forward_tokens": self.stats.jump_forward_tokens,
                **self.compiler.stats_dict(),
                "grammar_admission_seconds": self.stats.admission_s.snapshot(),
                **self._compile_stats(),
                "grammar_forced_completions": self.completion.forced if self.completion else 0,
                "grammar_repetition_stops": self.completion.repetitions if self.completion else 0,
                "grammar_completion_searches": self.completion.search.searches
                if self.completion else 0,
                "grammar_completion_shared": self.completion.search.cache_hits
                if self.completion else 0}

    def _compile_stats(self) -> dict:
        """Compiles run by the workers, and the on-disk cache's counters (disk_cache.py)."""
        pool, disk = self.compiler._pool, self.compiler.disk
        return {"grammar_compiles": pool.stats.compiles if pool is not None else 0,
                **(disk.cache.stats_dict() if disk is not None else {})}

    def shutdown(self) -> None:
        if self._owns_compiler:
            self.compiler.shutdown()
        if self.completion is not None and self.completion.jobs is not None:
            self.completion.jobs.shutdown()


def create_grammar_manager(config: Any, tokenizer: Any, vocab_size: int,
                           eos_token_ids: Sequence[int]) -> GrammarManager | None:
    """From an ``EngineConfig``: None when ``grammar_backend == "none"``."""
    from .registry import create_grammar_backend

    backend = create_grammar_backend(config.grammar_backend, tokenizer, vocab_size,
                                     list(eos_token_ids) or None)
    if backend is None:
        return None
    completion = CompletionConfig(enabled=not config.disable_forced_completion,
                                  slack_tokens=config.grammar_completion_slack,
                                  repetition_window=config.grammar_repetition_window)
    pool = PoolLimits(workers=config.grammar_compile_workers,
                      max_queued=config.grammar_compile_queue,
                      memory_bytes=config.grammar_compile_memory_bytes,
                      max_wait_s=config.grammar_compile_max_wait_s)
    manager = GrammarManager(backend, tokenizer, vocab_size, eos_token_ids,
                             timeout_s=config.grammar_compile_timeout_s, pool=pool,
                             disk_cache=disk_cache_from_config(config, backend),
                             jump_forward=not getattr(config, "disable_jump_forward", False),
                             jump_max_batch=getattr(config, "grammar_jump_max_batch", None),
                             completion=completion)
    manager.compiler.start()  # the workers start while the scheduler finishes its own start
    return manager

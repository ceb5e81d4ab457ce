"""GrammarManager: the scheduler's one handle on constrained decoding.

The scheduler calls, in order: ``admit`` when a request arrives (compilation starts in the
compiler's worker processes; the request waits in ``pending``, the "grammar pending" state, without
blocking the loop), ``poll`` each step (requests whose grammar is ready move on to the waiting
queue; failures come back with their ``InvalidRequestError``), ``fill_bitmask`` before sampling
(one packed bitmask for the batch, filled by the backend's batch call while the forward runs
on the device), and ``after_sample`` once tokens are appended (one batch accept call): it
advances each matcher, finishes requests whose grammar terminated or admits only a stop token,
and applies jump-forward and forced completions (``steps.py``, ``forcing/appends.py``: forced
text appended without sampling; the scheduler feeds those tokens in the request's next decode
step, one decode row each: a mixed step). A request that returns logprobs jumps too, through
the queue: it owes the forced tokens' logprobs (``forced_logprobs_owed``), which the rows of
its next extend supply; a jump that would finish it is undone and the tokens are sampled. With
overlap scheduling, ``prefetch`` lets the rows with nothing else to do be accepted and filled
on a helper thread while the rest of the step runs (prefetch.py).

Requests need the attributes ``grammar``, ``grammar_pending`` and ``forced_logprobs_owed``
(``Req`` defines them).
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import InvalidRequestError
from .base import GrammarBackend, GrammarKey
from .compile.admission import Histogram
from .compile.compiler import WARM_PROBE, GrammarCompiler
from .compile.disk_cache import GrammarDiskCache, disk_cache_from_config
from .compile.precompile import Precompiles
from .compile.pool_limits import PoolLimits
from .forcing.completion import CompletionConfig, CompletionTracker
from .guards.unique_keys import build_quote_tokens, guard_keys, has_open_keys, marked_schema
from .steps import GrammarSteps


@dataclass
class GrammarStats:
    """Measurements for benchmarks and /metrics."""

    mask_fill_s: list[float] = field(default_factory=list)  # per step, per constrained row
    jump_forward_tokens: int = 0
    sampled_tokens: int = 0  # tokens sampled under a grammar
    # a request's admission: from its compile's submit (limit checks included) until its
    # grammar is ready here (or failed): the wait a constrained request adds
    admission_s: Histogram = field(default_factory=Histogram)


class GrammarManager(GrammarSteps):
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
        # True in an Engine: its front end checked each request's JSON schema against the
        # meta-schema (RequestBuilder), so the compile worker need not (compiler.submit)
        self.requests_checked = False
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
        (compile, load, guard), and the estimate worker starting where estimates go to it, so
        the first request pays no start-up. False if the workers did not come up within ``timeout_s``."""
        try:
            if not self.compiler.warm(timeout_s):
                return False
            grammar = self.compiler.submit(WARM_PROBE).result()  # guarded as a request's is
        except InvalidRequestError:  # a backend without JSON schemas: the workers are up
            return True
        # NOTE: only where this backend's estimates go out (estimate.py: outlines' are searched
        # here, and ``_guard`` never names them to the worker): else it would idle all along
        if self.completion is not None and self.completion.jobs is not None \
                and grammar.thread_safe_batch:
            self.completion.jobs.worker.start()
        guard_keys(grammar, WARM_PROBE, self.quote_tokens, self.compiler.backend.name)
        return True

    def admit(self, req: Any) -> bool:
        """Start compiling ``req``'s constraint; True if it now waits in ``pending``. Raises
        ``InvalidRequestError`` at once for limit violations and known-bad grammars, and
        ``GrammarQueueFullError`` (retryable) when the compile queue is too long."""
        constraint = req.sampling_params.constraint
        if constraint is None:
            return False
        req.grammar_pending = self.compiler.submit(GrammarKey.from_constraint(*constraint),
                                                   meta_checked=self.requests_checked)
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
        # NOTE: only grammars whose estimates go out (estimate.py; outlines' are searched
        # here): the worker's copy of any other was a whole compile for nothing
        if self.completion is not None and grammar.thread_safe_batch \
                and self.completion.may_estimate(req):
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
    manager.requests_checked = True  # every request came through the Engine's RequestBuilder
    manager.compiler.start()  # the workers start while the scheduler finishes its own start
    return manager

"""Grammar compilation that cannot hurt the server: size limits checked up front, compiles in
killable worker processes (``worker_pool.py``) with a deadline and a memory budget, and a
bounded cache keyed by (kind, text) here in the parent.

The scheduler calls ``submit(key)`` at admission (cheap: limit checks plus a cache lookup) and
parks the request as "grammar pending"; each step it polls ``PendingGrammar.ready()`` and, once
ready, ``result()`` gives a fresh matcher or raises ``InvalidRequestError`` naming the field and
the limit it broke. The backend is rebuilt once per worker (from ``backend.spec``); what the
worker ships back is made usable here on a pool thread (``backend.ship`` / ``receive``:
xgrammar compiles again from the shipped source, which the worker proved to finish within the
deadline and memory budget; its serialized form cost far more, benchmarks/RESULTS.md, and is
made afterwards for the on-disk cache only).
Identical keys in flight share one compile (one cache entry).

A compile past its deadline (counted from when its worker started it) is killed with its
worker; its key is remembered as too slow, so a resubmission fails at once. The wait for a
worker has no deadline: admission bounds it (``admission.py``; a retryable
``GrammarQueueFullError`` when the expected wait is too long). The cache holds failures too
(they are cheap and deterministic), bounded by entry count and by the bytes of the compiled
grammars it holds.

With ``disk`` (a ``GrammarDiskCache``), a key missing here whose file is on disk is loaded from
there (``disk_loader.py``: on its own thread, never through the compile queue), and fresh
compiles are written there, so restarts and replicas on one machine reuse them.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Callable

from ...errors import GrammarQueueFullError, InvalidRequestError
from ..base import Grammar, GrammarBackend, GrammarKey
from .disk_cache import GrammarDiskCache
from .disk_loader import DiskLoader
from .limits import GrammarLimits
from .worker import WorkerInit
from .compile_job import CompileJob, CompileTimeout
from .pool_limits import PoolLimits
from .worker_pool import CompileWorkerPool


# What ``warm`` compiles: a small schema that takes the normalizer's and the guards' paths.
WARM_PROBE = GrammarKey("json_schema", '{"type": "object", "properties": {"sgdsl_warm": '
                                       '{"type": "string", "maxLength": 8}}, '
                                       '"required": ["sgdsl_warm"]}')


@dataclass
class _Entry:
    job: CompileJob

    @property
    def future(self) -> Future:
        return self.job.future

    def size(self) -> int:
        """Bytes the compiled grammar holds; 0 while pending or failed."""
        f = self.job.future
        return f.result()[1] if f.done() and not f.cancelled() and not f.exception() else 0


@dataclass
class CompilerStats:
    hits: int = 0
    misses: int = 0
    timeouts: int = 0  # requests failed at their compile's deadline
    rejected_busy: int = 0  # refused at submit: the queue's wait too long, or it was full
    compile_s: list[float] = field(default_factory=list)


class PendingGrammar:
    """A request's handle on a compile in flight (queued, compiling, or done)."""

    def __init__(self, compiler: "GrammarCompiler", key: GrammarKey, entry: _Entry,
                 submitted: float) -> None:
        self.compiler = compiler
        self.key = key
        self._entry = entry
        self.submitted = submitted

    def ready(self) -> bool:
        """True once ``result()`` will not block: compiled or failed (the pool ends every
        compile by its deadline, and fails what is queued at shutdown)."""
        return self._entry.future.done()

    def future(self) -> Future:
        """The compile's future (shared by every request with the same key)."""
        return self._entry.future

    def result(self, wait: bool = False) -> Grammar:
        """A fresh matcher; raises ``InvalidRequestError`` on failure. ``wait``: block until
        the compile is done (offline use, tests), else it must be ``ready()``."""
        fut = self._entry.future
        if wait:
            fut.exception()  # compiled, failed, or stopped at its deadline
        if not fut.done() or fut.cancelled():
            raise InvalidRequestError(f"{self.key.field} has not compiled yet",
                                      field=self.key.field)
        exc = fut.exception()
        if exc is not None:
            if isinstance(exc, CompileTimeout):
                self.compiler.stats.timeouts += 1
            raise exc
        return self.compiler.backend.new_grammar(fut.result()[0])


class GrammarCompiler:
    """Compiles grammar keys for one backend in worker processes, with a bounded LRU cache.

    ``pool`` limits are the workers' (count, queue wait, memory, result size); ``timeout_s`` is
    a compile's deadline, from when a worker starts it. The pool starts on the first submit (or
    ``start()``; ``warm()`` also waits for it).
    """

    def __init__(self, backend: GrammarBackend, *, limits: GrammarLimits | None = None,
                 timeout_s: float = 10.0, max_workers: int | None = None, cache_size: int = 1024,
                 cache_bytes: int = 1 << 30, pool: PoolLimits | None = None,
                 disk: GrammarDiskCache | None = None,
                 after: Callable[[GrammarKey], None] | None = None) -> None:
        """``after(key)``: run on a pool thread once ``key`` compiled, before its requests
        see it (the manager builds its guard tables there, off the scheduler loop)."""
        self.backend = backend
        self.after = after
        self.limits = limits or GrammarLimits()
        self.timeout_s = timeout_s
        self.pool_limits = pool or PoolLimits(workers=max_workers)
        self.cache_size = cache_size
        self.cache_bytes = cache_bytes
        self.stats = CompilerStats()
        self._lock = threading.Lock()
        self._cache: OrderedDict[GrammarKey, _Entry] = OrderedDict()
        self._pool: CompileWorkerPool | None = None
        self.disk = None if disk is None else DiskLoader(disk, backend,
                                                         self.pool_limits.workers)

    @property
    def pool(self) -> CompileWorkerPool:
        with self._lock:
            return self._pool_locked()

    def start(self) -> None:
        """Start the worker processes now instead of at the first compile."""
        self.pool  # noqa: B018 - property with a side effect

    def warm(self, timeout_s: float = 120.0) -> bool:
        """Start the workers and wait (up to ``timeout_s``) until each is up, then compile a
        small schema through the whole path (limits, a worker, ``receive``), so the first
        request pays no start-up. False if that did not finish in time."""
        if not self.pool.warm(timeout_s):
            return False
        pending = self.submit(WARM_PROBE)
        try:
            pending.future().exception(timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def submit(self, key: GrammarKey, meta_checked: bool = False) -> PendingGrammar:
        """Start (or reuse) the compile of ``key``; limit violations raise here, at once.
        ``meta_checked``: a JSON schema passed its meta-schema check where the request was
        built (the Engine's front end, ``RequestBuilder``), so its worker does not repeat it
        (jsonschema, pure Python: it took the GIL from the normalizer, ~25 ms of a 70 ms p50
        compile, benchmarks/RESULTS.md). A key in the cache passed that check either way."""
        if not self.backend.supports(key.kind):
            raise InvalidRequestError(
                f"the {self.backend.name} grammar backend does not support {key.kind}",
                field=key.field)
        submitted = time.monotonic()
        with self._lock:
            entry = self._cache.get(key)
        if entry is None:
            # NOTE: only for a key not seen (or evicted): a cached key passed already. The
            # meta-schema check (jsonschema: 20-300 ms for a large schema, on this, the
            # scheduler's, thread) runs in the worker beside the compile instead.
            self.limits.check(key, meta=False)  # keywords: backend.compile (normalizer)
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
                self.stats.hits += 1
                if isinstance(entry.future.done() and entry.future.exception(), CompileTimeout):
                    raise InvalidRequestError(
                        f"{key.field} did not compile within the {self.timeout_s:g} s deadline "
                        "(an identical request timed out before)", field=key.field)
            else:
                self.stats.misses += 1
                try:
                    job = self._start_job(key, not meta_checked)
                except GrammarQueueFullError:
                    self.stats.rejected_busy += 1
                    raise
                entry = self._cache[key] = _Entry(job)
                self._evict()
        return PendingGrammar(self, key, entry, submitted)

    def _start_job(self, key: GrammarKey, meta_check: bool) -> CompileJob:
        """From the disk cache if the key's file is there, else compiled by the pool."""
        pool = self._pool_locked()
        if self.disk is not None and self.disk.has(key):
            return self.disk.submit(key, pool)
        return pool.submit(key, meta_check)

    def compile(self, key: GrammarKey) -> Grammar:
        """Blocking convenience (offline use, tests): submit and wait up to the deadline."""
        return self.submit(key).result(wait=True)

    def compile_seconds(self, key: GrammarKey) -> float | None:
        """Time the worker spent compiling ``key`` (None while running, failed or unknown)."""
        entry = self._cache.get(key)
        return entry.future.result()[2] if entry and entry.size() else None

    def shutdown(self) -> None:
        """Kill the workers (no process is left behind); pending requests fail."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
        if self.disk is not None:
            self.disk.shutdown()  # after the pool: the compiles it handed over are written

    def _pool_locked(self) -> CompileWorkerPool:
        if self._pool is None:
            spec = self.backend.spec
            if spec is None:
                raise InvalidRequestError(
                    f"the {self.backend.name} grammar backend cannot run in a worker (no spec)",
                    field="grammar_backend")
            init = WorkerInit(spec, self.pool_limits.memory_bytes)
            limits = PoolLimits(**{**self.pool_limits.__dict__, "timeout_s": self.timeout_s})
            self._pool = CompileWorkerPool(
                init, self.backend.receive, limits, self.backend.compiled_bytes, self.after,
                on_compiled=None if self.disk is None else self.disk.store)
        return self._pool

    def stats_dict(self) -> dict:
        """The compile pipeline's counters, gauges and histograms (``Engine.stats()``)."""
        out = {"grammar_compile_cache_hits": self.stats.hits,
               "grammar_compile_cache_misses": self.stats.misses,
               "grammar_compile_timeouts": self.stats.timeouts}
        pool = self._pool
        if pool is not None:
            out.update(pool.admission.stats())
        return out

    def _evict(self) -> None:
        """Drop the oldest finished entries past the count or byte bound."""
        total = sum(e.size() for e in self._cache.values())
        for key in list(self._cache):
            if len(self._cache) <= self.cache_size and total <= self.cache_bytes:
                return
            entry = self._cache[key]
            if entry.future.done():  # never drop a compile someone may be waiting on
                total -= entry.size()
                del self._cache[key]

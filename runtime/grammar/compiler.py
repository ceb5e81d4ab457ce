"""Grammar compilation off the scheduler loop: a thread pool, a cache keyed by (kind, text), size
limits checked up front and a deadline per request.

The scheduler calls ``submit(key)`` at admission (cheap: limit checks plus a cache lookup) and
parks the request as "grammar pending"; each step it polls ``PendingGrammar.ready()`` and, once
ready, ``result()`` gives a fresh matcher or raises ``InvalidRequestError`` naming the field.

Native compilers cannot be interrupted. A compile that outlives its deadline fails its requests,
its key is remembered as too slow (a resubmission fails at once), and the worker pool is replaced
so queued compiles do not wait behind it; the stuck thread finishes on its own and is discarded.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequestError
from .base import Grammar, GrammarBackend, GrammarKey
from .limits import GrammarLimits


@dataclass
class _Entry:
    future: Future
    pool: ThreadPoolExecutor
    compile_s: float | None = None  # set by the worker when it finishes


@dataclass
class CompilerStats:
    hits: int = 0
    misses: int = 0
    failures: int = 0
    timeouts: int = 0
    compile_s: list[float] = field(default_factory=list)


class PendingGrammar:
    """A request's handle on a compile in flight; its deadline counts from its own submit."""

    def __init__(self, compiler: "GrammarCompiler", key: GrammarKey, deadline: float) -> None:
        self.compiler = compiler
        self.key = key
        self.deadline = deadline

    def ready(self) -> bool:
        """True once ``result()`` will not block: compiled, failed, or past the deadline."""
        return self.compiler._future(self.key).done() or time.monotonic() >= self.deadline

    def future(self) -> Future:
        """The compile's future (shared by every request with the same key)."""
        return self.compiler._future(self.key)

    def result(self, wait: bool = False) -> Grammar:
        """A fresh matcher; raises ``InvalidRequestError`` on failure or a missed deadline."""
        fut = self.compiler._future(self.key)
        if wait and not fut.done():
            try:
                fut.exception(timeout=max(0.0, self.deadline - time.monotonic()))
            except TimeoutError:
                pass
        if not fut.done():
            self.compiler._expire(self.key)
            raise InvalidRequestError(
                f"{self.key.field} did not compile within the {self.compiler.timeout_s:g} s "
                "deadline", field=self.key.field)
        return self.compiler.backend.new_grammar(fut.result())


class GrammarCompiler:
    """Compiles grammar keys for one backend in worker threads, with a bounded LRU cache."""

    def __init__(self, backend: GrammarBackend, *, limits: GrammarLimits | None = None,
                 timeout_s: float = 10.0, max_workers: int = 2, cache_size: int = 1024) -> None:
        self.backend = backend
        self.limits = limits or GrammarLimits()
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self.cache_size = cache_size
        self.stats = CompilerStats()
        self._lock = threading.Lock()
        self._cache: OrderedDict[GrammarKey, _Entry] = OrderedDict()
        self._too_slow: set[GrammarKey] = set()
        self._pool = self._new_pool()

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.max_workers, thread_name_prefix="sgdsl-grammar")

    def submit(self, key: GrammarKey) -> PendingGrammar:
        """Start (or reuse) the compile of ``key``; limit violations raise here, at once."""
        if not self.backend.supports(key.kind):
            raise InvalidRequestError(
                f"the {self.backend.name} grammar backend does not support {key.kind}",
                field=key.field)
        self.limits.check(key)  # json_schema keywords are checked by backend.compile (normalizer)
        with self._lock:
            if key in self._too_slow:
                raise InvalidRequestError(
                    f"{key.field} did not compile within the {self.timeout_s:g} s deadline "
                    "(an identical request timed out before)", field=key.field)
            entry = self._cache.get(key)
            if entry is not None:
                self._cache.move_to_end(key)
                self.stats.hits += 1
            else:
                self.stats.misses += 1
                self._cache[key] = self._start(key)
                self._evict()
        return PendingGrammar(self, key, time.monotonic() + self.timeout_s)

    def compile(self, key: GrammarKey) -> Grammar:
        """Blocking convenience (offline use, tests): submit and wait up to the deadline."""
        return self.submit(key).result(wait=True)

    def compile_seconds(self, key: GrammarKey) -> float | None:
        """Wall time the worker spent compiling ``key`` (None while running or unknown)."""
        entry = self._cache.get(key)
        return entry.compile_s if entry else None

    def shutdown(self) -> None:
        with self._lock:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _start(self, key: GrammarKey) -> _Entry:
        entry = _Entry(Future(), self._pool)
        entry.future = self._pool.submit(self._run, key, entry)
        return entry

    def _run(self, key: GrammarKey, entry: _Entry) -> Any:
        t0 = time.perf_counter()
        try:
            return self.backend.compile(key)
        except InvalidRequestError:
            self.stats.failures += 1
            raise
        except Exception as e:  # never let a worker surface a bare KeyError later
            self.stats.failures += 1
            raise InvalidRequestError(f"{key.field} failed to compile: {e}",
                                      field=key.field) from e
        finally:
            entry.compile_s = time.perf_counter() - t0
            self.stats.compile_s.append(entry.compile_s)

    def _future(self, key: GrammarKey) -> Future:
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:  # evicted while pending: start again (rare; cache is large)
                entry = self._cache[key] = self._start(key)
            return entry.future

    def _expire(self, key: GrammarKey) -> None:
        """A compile missed its deadline: remember the key and move queued work to a new pool."""
        with self._lock:
            entry = self._cache.pop(key, None)
            self._too_slow.add(key)
            self.stats.timeouts += 1
            if entry is None or entry.pool is not self._pool or entry.future.done():
                return
            old, self._pool = self._pool, self._new_pool()
            for k, e in list(self._cache.items()):
                if e.pool is old and e.future.cancel():  # queued, not started: requeue
                    self._cache[k] = self._start(k)
            old.shutdown(wait=False)

    def _evict(self) -> None:
        while len(self._cache) > self.cache_size:
            oldest = next(iter(self._cache))
            if not self._cache[oldest].future.done():
                return  # never drop a compile someone may be waiting on
            self._cache.popitem(last=False)

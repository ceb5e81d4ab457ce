"""DiskLoader: the compiler's way to the on-disk cache (``disk_cache.py``), on threads of its
own, so the scheduler loop never touches the disk.

The loader keeps an index of the files on disk (the names in the backend's folder, read when it
starts, then after its own writes and evictions, and again at most every ``RESCAN_S`` when a key
is missing, so another replica's compiles show up). ``GrammarCompiler.submit`` asks ``has(key)``
(a set lookup) and, for a key on disk, takes a job from ``submit`` instead of the compile pool:
the file is read and rebuilt by one of ``threads`` load threads (the backend's ``receive``, else
``deserialize``: what a worker's reply goes through too; several, so one big grammar does not
hold up the small ones behind it). Such a job never enters the compile queue: a burst of cached
constraints is answered at disk speed whatever the workers are doing, and does not count
against the queue's admission. A file that turns out missing or damaged is dropped from the
index and its key handed to the pool to be compiled (the rare fallback; it may then be refused
as busy like any new compile).

What the workers compile comes back here (``store``) to be written, off their slot threads, by
the loader's own thread, which also keeps the index.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from typing import Any

from ..base import GrammarKey
from .disk_cache import GrammarDiskCache

logger = logging.getLogger(__name__)

RESCAN_S = 2.0  # a missing key rescans the folder at most this often (another replica's files)
# The fallback compile of an admitted key retries a busy pool's refusal this long (the request
# was admitted as cached; its compile waits for room as a queued one would)
_REFUSED_RETRY_S = 60.0
_INDEX_WAIT_S = 5.0  # the first lookups wait this long at most for the first scan


class DiskLoader:
    """Loads of one ``GrammarDiskCache`` on ``threads`` threads; its stores and index on one."""

    def __init__(self, cache: GrammarDiskCache, backend: Any, threads: int = 2) -> None:
        self.cache = cache
        self.threads = threads
        self._loads: cf.ThreadPoolExecutor | None = None
        # what the pool makes of a worker's payload (the file holds the same bytes)
        self._rebuild = getattr(backend, "receive", None) or backend.deserialize
        self._size = getattr(backend, "compiled_bytes", None) or (lambda _c, data: len(data))
        self.load_s: list[float] = []  # per hit: read, check and rebuild (a window)
        self._index: set[str] = set()
        self._indexed = threading.Event()
        self._scanned_at = 0.0
        self._rescan_asked = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.start()

    def start(self) -> cf.ThreadPoolExecutor:
        """Start the threads (again after ``shutdown``); the loader's own opens and indexes the
        cache first. Returns the load threads' executor."""
        with self._lock:
            if self._thread is None:
                self._loads = cf.ThreadPoolExecutor(self.threads,
                                                    thread_name_prefix="sgdsl-grammar-load")
                self._queue.put(("scan",))
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="sgdsl-grammar-disk")
                self._thread.start()
            return self._loads  # type: ignore[return-value]

    def has(self, key: GrammarKey) -> bool:
        """Whether ``key``'s file is on disk, as far as the index knows (no disk access)."""
        if not self._indexed.wait(_INDEX_WAIT_S) or self.cache.disabled is not None:
            return False
        name = self.cache.path(key).name
        if name in self._index:
            return True
        self.cache._count("misses")
        if not self._rescan_asked and time.monotonic() - self._scanned_at > RESCAN_S:
            self._rescan_asked = True
            self._queue.put(("scan",))
        return False

    def submit(self, key: GrammarKey, pool: Any) -> Any:
        """A ``worker_pool.CompileJob`` for ``key`` completed from its file, or by ``pool``
        if the file fails to load."""
        from .compile_job import CompileJob

        job = CompileJob(key, time.monotonic())
        self.start().submit(self._load_or_compile, job, pool)
        return job

    def store(self, key: GrammarKey, payload: bytes) -> None:
        """Write a fresh compile's payload (later, on the loader thread)."""
        self.start()
        self._queue.put(("store", key, payload))

    def shutdown(self) -> None:
        """Stop the threads once the queued work is done (stores included)."""
        with self._lock:
            thread, self._thread = self._thread, None
            loads, self._loads = self._loads, None
        if loads is not None:
            loads.shutdown(wait=True)
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=30)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if item[0] == "store":
                    evicted = self.cache.store(item[1], item[2])
                    self._index.add(self.cache.path(item[1]).name)
                    if evicted:  # the store made room: the index follows
                        self._scan()
                else:
                    self._scan()
            except Exception:  # noqa: BLE001 - a cache problem must never fail a compile
                logger.exception("grammar disk cache: %s failed", item[0])
            finally:
                self._indexed.set()  # whatever happened to the first scan, nobody waits

    def _scan(self) -> None:
        self.cache.identity  # noqa: B018 - computed here (the tokenizer's hash), not on the loop
        self._index = set(self.cache.names())  # opens the cache first
        self._scanned_at, self._rescan_asked = time.monotonic(), False

    def _load_or_compile(self, job: Any, pool: Any) -> None:
        try:
            self._load(job, pool)
        except Exception:  # noqa: BLE001 - a cache problem must never fail a compile
            logger.exception("grammar disk cache: loading %s failed", job.key.field)
            self._compile(job, pool)

    def _load(self, job: Any, pool: Any) -> None:
        if job.future.done():
            return  # its requests gave up
        t0 = time.perf_counter()
        payload = self.cache.load(job.key)
        compiled = None
        if payload is not None:
            try:
                compiled = self._rebuild(payload)
            except Exception as e:  # noqa: BLE001 - a format the backend no longer reads
                self.cache._bad(self.cache.path(job.key), f"does not load: {e}")
        if compiled is None:
            self._index.discard(self.cache.path(job.key).name)
            self._compile(job, pool)
            return
        after = getattr(pool, "after", None)  # the tables its requests read, built here
        if after is not None:
            after(job.key)
        seconds = time.perf_counter() - t0
        try:
            job.future.set_result((compiled, self._size(compiled, payload), seconds))
        except InvalidStateError:
            return  # cancelled meanwhile
        self.load_s.append(seconds)
        del self.load_s[:-1024]

    @staticmethod
    def _compile(job: Any, pool: Any) -> None:
        """The fallback: ``job``'s key goes to the compile pool; its outcome becomes ``job``'s.
        A refusal other than an invalid request (the pool busy) is retried for a while."""
        from ...errors import InvalidRequestError

        give_up = time.monotonic() + _REFUSED_RETRY_S
        while not job.future.done():
            try:
                inner = pool.submit(job.key)
                break
            except Exception as e:  # noqa: BLE001 - refused: busy, or shut down
                if isinstance(e, InvalidRequestError) or time.monotonic() > give_up:
                    _settle(job.future, exception=e)
                    return
                time.sleep(min(1.0, float(getattr(e, "retry_after", 1.0))))
        else:
            return
        job.future.add_done_callback(lambda f: f.cancelled() and inner.future.cancel())
        inner.future.add_done_callback(lambda f: _copy(f, job.future))


def _copy(source: Future, target: Future) -> None:
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        _settle(target, exception=source.exception())
    else:
        _settle(target, result=source.result())


def _settle(future: Future, result: Any = None, exception: BaseException | None = None) -> None:
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass  # cancelled meanwhile

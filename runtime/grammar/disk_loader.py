"""DiskLoader: the compile pool's way to the on-disk cache (``disk_cache.py``), on a thread of
its own, so the scheduler loop never touches the disk.

Every compile job the pool queues is also handed here. The loader reads the job's file and, on
a hit, rebuilds the compiled grammar with the backend's ``deserialize`` (what a worker's reply
goes through too) and completes the job; a worker that takes the job meanwhile waits until the
lookup is over (``CompileJob.looked_up``), then skips it if it is done, so a hit is never
compiled. Lookups do not queue behind compiles: a burst of cached constraints is answered at
disk speed whatever the workers are doing. What the workers compile comes back here to be
written (``store``), off their slot threads.

The cache's identity (a hash of the tokenizer, ~0.1 s) is computed on this thread when the
loader starts, not on the first request.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import InvalidStateError
from typing import Any, Callable

from .base import GrammarKey
from .disk_cache import GrammarDiskCache

logger = logging.getLogger(__name__)

_OPEN = "open"


class DiskLoader:
    """One thread serving lookups and stores of one ``GrammarDiskCache`` in arrival order."""

    def __init__(self, cache: GrammarDiskCache) -> None:
        self.cache = cache
        self.load_s: list[float] = []  # per hit: read, check and deserialize (a window)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.start()

    def start(self) -> None:
        """Start the thread (again after ``shutdown``); it opens the cache first."""
        with self._lock:
            if self._thread is None:
                self._queue.put((_OPEN,))
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="sgdsl-grammar-disk")
                self._thread.start()

    def look_up(self, job: Any, deserialize: Callable[[bytes], Any]) -> None:
        """Complete ``job`` (a ``worker_pool.CompileJob``) from disk if its file is there;
        ``job.looked_up`` is set either way."""
        self.start()
        self._queue.put(("load", job, deserialize))

    def store(self, key: GrammarKey, payload: bytes) -> None:
        """Write a fresh compile's payload (later, on the loader thread)."""
        self.start()
        self._queue.put(("store", key, payload))

    def shutdown(self) -> None:
        """Stop the thread once the queued work is done (stores included)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=30)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if item[0] == "load":
                    self._load(item[1], item[2])
                elif item[0] == "store":
                    self.cache.store(item[1], item[2])
                else:
                    self.cache.identity  # noqa: B018 - computed now, off the scheduler loop
                    self.cache.open()
            except Exception:  # noqa: BLE001 - a cache problem must never fail a compile
                logger.exception("grammar disk cache: %s failed", item[0])
            finally:
                if item[0] == "load":
                    item[1].looked_up.set()

    def _load(self, job: Any, deserialize: Callable[[bytes], Any]) -> None:
        if job.future.done():
            return  # its requests gave up
        t0 = time.perf_counter()
        payload = self.cache.load(job.key)
        if payload is None:
            return
        try:
            compiled = deserialize(payload)
        except Exception as e:  # noqa: BLE001 - a format the backend no longer reads
            self.cache._bad(self.cache.path(job.key), f"does not load: {e}")
            return
        seconds = time.perf_counter() - t0
        try:
            job.future.set_result((compiled, len(payload), seconds))
        except InvalidStateError:
            return  # cancelled meanwhile (its deadline passed)
        self.load_s.append(seconds)
        del self.load_s[:-1024]

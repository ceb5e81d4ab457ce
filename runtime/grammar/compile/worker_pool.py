"""A small pool of killable compile worker processes (``worker.py``).

Native grammar compilers cannot be interrupted, and a thread that missed its deadline keeps
eating CPU and memory: 140 slow schemas once took a scheduler past 21 GB and the kernel killed
it. So every compile runs in a worker process with a memory budget, and:

- a compile past its deadline gets its worker killed (and replaced); its job fails naming the
  deadline in seconds; the other workers keep compiling;
- a compile over the memory budget fails naming the budget in bytes, its worker replaced; so
  does a worker that crashes (segfault, abort);
- at most ``workers`` compiles run at once; a new one waits only if its expected wait is
  within ``max_wait_s`` and fewer than ``max_queued`` wait (``admission.py``); beyond
  that ``submit`` refuses at once with a retryable ``GrammarQueueFullError``;
- the deadline counts from when a worker starts the compile: it bounds compile work, never the
  wait in the queue (a busy server must not fail valid requests as too slow to compile);
- the worker ships its result (``backend.ship``) and the slot's thread makes it usable here
  (``backend.receive``; never on the scheduler loop);
- what a worker compiles is handed to ``on_compiled(key, payload)`` (the on-disk cache's
  writer, ``disk_loader.py``), once it loaded here. Where the backend can make a payload that
  loads faster (``backend.ship_again``: xgrammar's serialized grammar, which may cost several
  times the compile to write) and no other job waits, the slot asks the worker for it after
  the request was served, and that is stored instead: a restart loads it rather than
  compiling. It never delays the request that compiled it (it once did: 6.6 -> 17.5 s on a
  schema whose JSON was 16x its grammar; benchmarks/RESULTS.md), and anything that goes
  wrong there (its own deadline, memory) only leaves the first payload stored.

Each slot is one thread driving one worker synchronously (send a job, wait for its reply or its
deadline with ``select``), so the deadline is exact and needs no other timer. Workers start with
the pool, in the background, and die with it (``shutdown``; or with their parent process);
``warm`` waits until each has started and compiled once.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import InvalidRequestError
from ..base import GrammarKey
from .admission import CompileAdmission
from .compile_job import CompileJob, CompileTimeout
from .pool_limits import PoolLimits
from .worker import WorkerInit
from .worker_handle import WorkerHandle, WorkerStartError


@dataclass
class PoolStats:
    compiles: int = 0
    timeouts: int = 0  # workers killed at a deadline
    memory_failures: int = 0
    crashes: int = 0
    workers_started: int = 0
    compile_s: list[float] = field(default_factory=list)  # inside the worker, per compile


class CompileWorkerPool:
    """Runs ``CompileJob``s in worker processes; ``receive`` makes each result usable here and
    ``size_of(result, shipped bytes)`` tells the bytes it holds."""

    def __init__(self, init: WorkerInit, receive: Callable[[bytes], Any],
                 limits: PoolLimits | None = None,
                 size_of: Callable[[Any, bytes], int] | None = None,
                 after: Callable[[GrammarKey], None] | None = None, *,
                 on_compiled: Callable[[GrammarKey, bytes], None] | None = None) -> None:
        """``after(key)``: run on the slot's thread once a key's result is loaded, before its
        requests see it (tables the scheduler will want for it, built off its loop)."""
        self.init = init
        self.receive = receive
        self.after = after
        self.on_compiled = on_compiled
        self.size_of = size_of or (lambda _compiled, shipped: len(shipped))
        self.limits = limits or PoolLimits()
        self.stats = PoolStats()
        self.admission = CompileAdmission(self.limits.workers, self.limits.max_wait_s)
        self._up = threading.Condition()
        self._slots_up: set[int] = set()  # slots whose first worker started (see ``warm``)
        self._queue: queue.Queue[CompileJob | None] = queue.Queue(self.limits.max_queued)
        self._workers: dict[int, WorkerHandle] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.ready_at: float | None = None  # when the first worker became ready
        self._ids = itertools.count()
        self._threads = [threading.Thread(target=self._serve, args=(slot,), daemon=True,
                                          name=f"sgdsl-grammar-{slot}")
                         for slot in range(self.limits.workers)]
        for t in self._threads:
            t.start()

    def submit(self, key: GrammarKey, meta_check: bool = True) -> CompileJob:
        """Queue a compile; raises ``GrammarQueueFullError`` (retryable) when it would wait
        too long or the queue is full. ``meta_check``: the worker checks a JSON schema against
        its meta-schema beside the compile."""
        job = CompileJob(key, time.monotonic(), meta_check=meta_check)
        if self._closed:
            raise InvalidRequestError("the grammar compiler is shut down", field=key.field)
        self.admission.admit(key.field)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise self.admission.full(key.field, self.limits.max_queued) from None
        return job

    def warm(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every slot's worker has started (False if one has
        not): requests after this pay no worker start-up."""
        with self._up:
            return self._up.wait_for(
                lambda: self._closed or len(self._slots_up) == len(self._threads), timeout_s)

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._workers.values()]

    def shutdown(self) -> None:
        """Kill every worker and fail what is queued; no process is left behind."""
        self._closed = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.admission.dropped()
                self._fail(job, "the engine is shutting down")
        with self._up:
            self._up.notify_all()
        for _ in self._threads:
            self._queue.put(None)
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.kill()
        for t in self._threads:
            t.join(timeout=10)

    # -- one slot ---------------------------------------------------------------------------------
    def _serve(self, slot: int) -> None:
        worker = None
        while True:
            if worker is None and not self._closed:
                worker = self._start(slot, None)  # replace a lost worker before the next job
            job = self._queue.get()
            if job is None or self._closed:
                break
            if job.future.done() or not job.future.set_running_or_notify_cancel():
                self.admission.dropped()
                continue  # its requests gave up while it was queued
            if worker is None:
                try:
                    worker = self._start(slot, job)
                except WorkerStartError as e:
                    self.admission.dropped()
                    self._fail(job, f"the grammar compile worker failed to start: {e}")
                    continue
            job.started = time.monotonic()
            self.admission.started(job.future, job.started - job.submitted)
            # compile in the worker, load here, reported (once served: a disk payload may follow)
            times: list = [None, None, False]
            try:
                worker = self._run(slot, worker, job, times)
            finally:
                self._finished(job, times)
        with self._lock:
            left = self._workers.pop(slot, None)
        if left is not None:
            left.kill()

    def _start(self, slot: int, job: CompileJob | None) -> WorkerHandle | None:
        """A fresh worker for ``slot``; raises WorkerStartError only when a job waits on it."""
        try:
            worker = WorkerHandle(self.init)
        except OSError as e:
            if job is None:
                return None  # retried when a job comes
            raise WorkerStartError(str(e)) from e
        with self._lock:  # registered before the handshake, so shutdown can kill it meanwhile
            if self._closed:
                worker.kill()
                return None
            self._workers[slot] = worker
            self.stats.workers_started += 1
        try:
            worker.handshake()
        except WorkerStartError:
            self._retire(slot, worker)
            if job is None:
                return None
            raise
        with self._lock:
            if self.ready_at is None:
                self.ready_at = time.monotonic()
        with self._up:
            self._slots_up.add(slot)
            self._up.notify_all()
        return worker

    def _run(self, slot: int, worker: WorkerHandle, job: CompileJob,
             times: list) -> WorkerHandle | None:
        """Compile one job; returns the worker if it may take the next one. ``times`` gets
        the seconds of the compile (in the worker) and of its load here."""
        field_name = job.key.field
        try:
            bounds = self.limits.deadline(job.started, worker.cpu_seconds())
            job_id = next(self._ids)
            worker.send((job_id, job.key, job.meta_check))
            reply = worker.recv(*bounds)
        except (EOFError, OSError):
            return self._lost(slot, worker, job, worker.exit_text())
        if reply is None:
            self.stats.timeouts += 1
            self._retire(slot, worker)
            job.future.set_exception(CompileTimeout(
                f"{field_name} did not compile within the {self.limits.timeout_s:g} s deadline "
                "(grammar_compile_timeout_s; the compile was stopped)", field=field_name))
            return None
        if reply[1] == "memory":
            return self._lost(slot, worker, job, "MemoryError")
        if reply[1] == "error":
            self._fail(job, reply[2])
            return worker
        times[0] = reply[3]
        # NOTE: decided before the result is set, so a caller's next submit cannot race it
        again = len(reply) > 5 and reply[5] and self.on_compiled is not None \
            and self._queue.empty()
        worker, delivered = self._deliver(slot, worker, job, *reply[2:5], times=times,
                                          store=not again)
        if again and delivered:
            return self._store_again(slot, worker, job, job_id, reply[2])
        return worker

    def _store_again(self, slot: int, worker: WorkerHandle | None, job: CompileJob,
                     job_id: int, payload: bytes) -> WorkerHandle | None:
        """With the job served and no other waiting: ask the worker for the payload that
        loads faster (``backend.ship_again``, xgrammar's serialized grammar) and give that to
        the on-disk cache, so a restart loads instead of compiling. Off every request's
        admission path; under a deadline of its own (past it, out of memory or a dead worker:
        the first payload is stored and the worker replaced)."""
        assert self.on_compiled is not None
        if worker is None:  # retired (it grew too much): its compile is gone with it
            self.on_compiled(job.key, payload)
            return None
        try:
            worker.send((job_id, "again"))
            reply = worker.recv(*self.limits.deadline(time.monotonic(), worker.cpu_seconds()))
        except (EOFError, OSError):
            reply = None
        better = None
        if reply is None or reply[1] != "again":
            self._retire(slot, worker)
            worker = None
        else:
            better = reply[2]
        if better is not None and len(better) <= self.limits.max_result_bytes:
            payload = better
        self.on_compiled(job.key, payload)
        return worker

    def _deliver(self, slot: int, worker: WorkerHandle, job: CompileJob, payload: bytes,
                 compile_s: float, used: int, times: list,
                 store: bool = True) -> tuple[WorkerHandle | None, bool]:
        """Make the result usable here and set it; (the worker if it may take the next job,
        whether the job got its result). ``store``: hand the payload to ``on_compiled``."""
        self.stats.compiles += 1
        self.stats.compile_s.append(compile_s)
        del self.stats.compile_s[:-1024]  # a window, not a leak
        delivered = False
        if len(payload) > self.limits.max_result_bytes:
            self._fail(job, f"{job.key.field} compiles to {len(payload)} bytes; the limit is "
                            f"{self.limits.max_result_bytes} bytes")
        else:
            t0 = time.monotonic()
            try:
                compiled = self.receive(payload)
                if self.after is not None:
                    self.after(job.key)
                job.future.set_result((compiled, self.size_of(compiled, payload), compile_s))
            except Exception as e:  # noqa: BLE001 - a version or format mismatch
                self._fail(job, f"{job.key.field} failed to load its compiled grammar: {e}")
            else:
                delivered = True
                if store and self.on_compiled is not None:
                    self.on_compiled(job.key, payload)
            times[1] = time.monotonic() - t0
            self._finished(job, times)
        worker.baseline = worker.baseline or used
        # NOTE: heap left over by earlier compiles counts against the budget of the next one;
        # a worker that grew by half its budget is replaced while idle.
        if used > worker.baseline + self.limits.memory_bytes // 2:
            self._retire(slot, worker)
            return None, delivered
        return worker, delivered

    def _finished(self, job: CompileJob, times: list) -> None:
        if not times[2]:
            times[2] = True
            self.admission.finished(job.future, times[0], times[1],
                                    time.monotonic() - job.started)

    def _lost(self, slot: int, worker: WorkerHandle, job: CompileJob, how: str) -> None:
        """The worker died or ran out of memory during ``job``: fail it, retire the worker."""
        self._retire(slot, worker)
        if self._closed:
            self._fail(job, "the engine is shutting down")
        elif how in ("MemoryError", "SIGABRT", "SIGKILL"):  # Rust and C++ abort on a failed alloc
            self.stats.memory_failures += 1
            self._fail(job, f"{job.key.field} needs more than the "
                            f"{self.limits.memory_bytes} bytes of memory one grammar compile may "
                            f"use (grammar_compile_memory_bytes; the worker stopped: {how})")
        else:
            self.stats.crashes += 1
            self._fail(job, f"{job.key.field} crashed the grammar compiler ({how})")
        return None

    def _retire(self, slot: int, worker: WorkerHandle) -> None:
        with self._lock:
            if self._workers.get(slot) is worker:
                del self._workers[slot]
        worker.kill()

    @staticmethod
    def _fail(job: CompileJob, message: str) -> None:
        if not job.future.done():
            job.future.set_exception(InvalidRequestError(message, field=job.key.field))

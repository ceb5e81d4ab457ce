"""EstimateProcess: the parent's link to the completion-estimate worker (``estimate_worker.py``).

The worker starts in the background on first use. The scheduler thread only queues messages
(``submit``): a sender thread writes them to the worker's pipe, so a full pipe never blocks the
scheduler, and a reader thread completes each job's future from the worker's replies. Both
threads spend their time in system calls, not Python.

Grammars are named to the worker by their ``GrammarKey`` once (``prepare``, at admission: the
worker compiles it meanwhile), then by a small id. A job is a ``concurrent.futures.Future``.
``outcome`` takes it: a job not sent while the worker is still starting is cancelled and
reported unanswered, as is one with no reply within ``ANSWER_WAIT_S`` (after which the link
counts as behind: later jobs are not waited for until the worker answers again); the caller
then searches itself. Since the search is
deterministic, what a request sees does not depend on whether the worker answered.

If the worker dies or cannot start, the link is marked dead (``dead`` says why, logged once)
and ``submit`` returns None from then on: estimates are searched in the scheduler's process, as
without a worker. Jobs in flight are bounded (``max_inflight``), and so is every table here.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Any, Sequence

from .estimate_worker import EstimateInit
from ..compile.worker_handle import WorkerHandle, WorkerStartError

logger = logging.getLogger(__name__)

ESTIMATE_WORKER = "from sgdsl.runtime.grammar.forcing.estimate_worker import main; main()"
# A job is taken COLLECT_AFTER decode steps after it was asked (tens of ms at batch); one
# sent but unanswered this much later yet is searched by the caller instead.
ANSWER_WAIT_S = 0.05
_GIDS = 1024  # grammar keys named to the worker (as many as it keeps)


class EstimateProcess:
    """One estimate worker and its two pipe threads (see the module doc)."""

    def __init__(self, init: EstimateInit, max_inflight: int = 1024) -> None:
        self._init = init
        self.max_inflight = max_inflight
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs: dict[int, cf.Future] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._gids: OrderedDict[Any, int] = OrderedDict()  # GrammarKey -> its id there
        self._handle: WorkerHandle | None = None
        self._started = False
        self._up = threading.Event()  # set once the worker answered its handshake, or died
        self._behind = False  # a job went unanswered and no reply came since
        self.dead: str | None = None  # why the worker is gone (None while usable)

    def start(self) -> None:
        """Start the worker in the background (idempotent)."""
        if not self._started and self.dead is None:
            self._started = True
            threading.Thread(target=self._send_loop, daemon=True,
                             name="sgdsl-estimate-send").start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Start the worker and wait up to ``timeout_s`` until it is up; False if it is not
        (dead, or still starting)."""
        self.start()
        self._up.wait(timeout_s)
        return self._up.is_set() and self.dead is None

    def prepare(self, key: Any) -> int:
        """Name the ``GrammarKey`` ``key`` to the worker (it compiles it now); its id."""
        self.start()
        gid = self._gids.get(key)
        if gid is None:
            gid = self._gids[key] = next(self._ids)
            self._queue.put(("grammar", gid, key))
            while len(self._gids) > _GIDS:
                self._gids.popitem(last=False)
        self._gids.move_to_end(key)
        return gid

    def submit(self, key: Any, token_ids: Sequence[int], deep: bool) -> cf.Future | None:
        """Search from a fresh matcher of the ``GrammarKey`` ``key`` advanced by
        ``token_ids``; None if the worker is dead or too many jobs are out."""
        if self.dead is not None or len(self._jobs) >= self.max_inflight:
            return None
        gid = self.prepare(key)
        job_id, future = next(self._ids), cf.Future()
        with self._lock:
            self._jobs[job_id] = future
        self._queue.put(("job", job_id, gid, tuple(token_ids), deep))
        return future

    def outcome(self, future: cf.Future) -> tuple[bool, Any]:
        """(answered, completion or None); (False, None) when the caller must search."""
        if (not self._up.is_set() or self._behind) and future.cancel():  # not sent yet
            return False, None
        try:
            return True, future.result(timeout=0 if self._behind else ANSWER_WAIT_S)
        except cf.TimeoutError:
            future.cancel()  # if it has not gone out yet, it never will
            if not self._behind:
                self._behind = True
                logger.info("completion estimates: no answer within %.2f s; searching here "
                            "until the worker catches up", ANSWER_WAIT_S)
            return False, None
        except Exception as e:  # noqa: BLE001 - the reason the worker gave, or its death
            logger.debug("completion estimate not answered: %s", e)
            return False, None

    def shutdown(self) -> None:
        self._die("shut down")
        self._queue.put(None)
        if self._handle is not None:
            self._handle.kill()

    def _send_loop(self) -> None:
        try:
            handle = WorkerHandle(self._init, ESTIMATE_WORKER)
        except OSError as e:
            self._die(f"the estimate worker did not start: {e}")
            return
        self._handle = handle
        try:
            handle.handshake()
        except WorkerStartError as e:
            self._die(f"the estimate worker did not start: {e}")
            return
        if self.dead is not None:  # shut down meanwhile
            handle.kill()
            return
        self._up.set()
        threading.Thread(target=self._read_loop, args=(handle,), daemon=True,
                         name="sgdsl-estimate-read").start()
        while (message := self._queue.get()) is not None:
            if not self._send(handle, message):
                return

    def _send(self, handle: WorkerHandle, message: tuple) -> bool:
        if message[0] == "job":
            with self._lock:
                future = self._jobs.get(message[1])
            if future is None or not future.set_running_or_notify_cancel():
                with self._lock:  # taken (cancelled) before it went out
                    self._jobs.pop(message[1], None)
                return True
        try:
            handle.send(message)
        except OSError as e:  # the worker is gone: say how it ended, as the reader would
            self._die(f"the estimate worker exited ({handle.exit_text()}; pipe: {e})")
            return False
        return True

    def _read_loop(self, handle: WorkerHandle) -> None:
        while True:
            try:
                reply = handle.recv(time.monotonic() + 3600.0)
            except (EOFError, OSError):
                self._die(f"the estimate worker exited ({handle.exit_text()})")
                return
            if reply is None:
                continue
            job_id, found, reason = reply
            self._behind = False
            with self._lock:
                future = self._jobs.pop(job_id, None)
            if future is None:
                continue
            if reason is None:
                future.set_result(found)
            else:
                future.set_exception(RuntimeError(reason))

    def _die(self, reason: str) -> None:
        """Mark the link dead and fail the jobs out (their callers search themselves)."""
        if self.dead is None:
            self.dead = reason
            self._up.set()  # nobody waits for a dead worker
            if reason != "shut down":
                logger.error("completion estimates: %s; searching in this process from now on",
                             reason)
        with self._lock:
            jobs, self._jobs = self._jobs, {}
        for future in jobs.values():
            if not future.done() and (future.running() or future.set_running_or_notify_cancel()):
                future.set_exception(RuntimeError(reason))

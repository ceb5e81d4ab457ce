"""GrammarCompiler on a scripted backend run in real worker processes: cache, typed failures,
the deadline (the worker is killed), the memory budget, crashes, the queue bound, shutdown."""
from __future__ import annotations

import os
import time

import pytest

from sgdsl.runtime.errors import GrammarQueueFullError, InvalidRequestError
from sgdsl.runtime.grammar import GrammarCompiler, GrammarKey
from sgdsl.runtime.grammar.compile.pool_limits import PoolLimits

from ..scripted_backend import ScriptedBackend
from processes import pid_alive


def _compiler(**pool: int) -> GrammarCompiler:
    c = GrammarCompiler(ScriptedBackend(), timeout_s=pool.pop("timeout_s", 60),
                        pool=PoolLimits(**{"workers": 1, **pool}))
    c.compile(GrammarKey("regex", "warm-up"))  # the workers' start is not part of any test
    return c


@pytest.fixture(scope="module")
def shared():
    c = _compiler(workers=2)
    yield c
    c.shutdown()


def test_cache_hit_compiles_once(shared):
    before = shared.pool.stats.compiles
    assert shared.compile(GrammarKey("regex", "a")) == "compiled:a"
    assert shared.compile(GrammarKey("regex", "a")) == "compiled:a"
    assert shared.pool.stats.compiles == before + 1 and shared.stats.hits >= 1
    assert shared.compile_seconds(GrammarKey("regex", "a")) is not None
    assert shared.compile(GrammarKey("regex", "pid")) != os.getpid()  # not compiled here


def test_failures_are_typed_and_cached(shared):
    for _ in range(2):
        with pytest.raises(InvalidRequestError, match="bad grammar") as e:
            shared.compile(GrammarKey("ebnf", "bad"))
        assert e.value.field == "ebnf"
    with pytest.raises(InvalidRequestError, match="failed to compile: KeyError") as e:
        shared.compile(GrammarKey("regex", "boom"))
    assert e.value.field == "regex"
    with pytest.raises(InvalidRequestError, match="failed to compile") as e:  # not a bare
        shared.compile(GrammarKey("regex", "lambda"))  # pickling error from the pipe
    assert e.value.field == "regex"


def test_pending_polls_without_blocking(shared):
    pending = shared.submit(GrammarKey("regex", "sleep:1"))
    assert not pending.ready()
    assert pending.result(wait=True) == "compiled:sleep:1" and pending.ready()


def test_deadline_kills_the_compile_others_keep_going():
    c = _compiler(workers=2, timeout_s=2)
    try:
        slow = c.submit(GrammarKey("regex", "spin:60"))
        fast = c.submit(GrammarKey("regex", "fast"))
        assert fast.result(wait=True) == "compiled:fast"
        pids = c.pool.worker_pids()
        with pytest.raises(InvalidRequestError, match=r"within the 2 s deadline") as e:
            slow.result(wait=True)
        assert e.value.field == "regex" and e.value.status == 400
        time.sleep(0.5)
        assert sum(pid_alive(p) for p in pids) == 1  # the slow compile's worker was killed
        with pytest.raises(InvalidRequestError, match="timed out before"):
            c.submit(GrammarKey("regex", "spin:60"))
        assert c.compile(GrammarKey("regex", "other")) == "compiled:other"
        assert c.pool.stats.timeouts == 1
    finally:
        c.shutdown()


def test_the_disk_payload_comes_after_the_request_and_never_fails_it():
    """``ship_again`` (xgrammar's serialized grammar) is asked only after the request got its
    result, and only for the disk cache (``on_compiled``): the request gets the first payload;
    past a deadline of its own, or out of memory, the first payload is stored and the worker
    replaced; no disk cache, nothing is asked."""
    from sgdsl.runtime.grammar.compile.worker import WorkerInit
    from sgdsl.runtime.grammar.compile.worker_pool import CompileWorkerPool

    from ..scripted_backend import ScriptedAgainBackend

    backend = ScriptedAgainBackend()
    stored = []
    limits = PoolLimits(workers=1, memory_bytes=256 << 20, timeout_s=1)
    pool = CompileWorkerPool(WorkerInit(backend.spec, limits.memory_bytes), backend.receive,
                             limits, on_compiled=lambda k, p: stored.append(backend.receive(p)))
    try:
        for text in ("again:ok", "again:spin:60", "again:hog", "after"):
            job = pool.submit(GrammarKey("regex", text))
            assert job.future.result(timeout=60)[0] == f"compiled:{text}"
        deadline = time.monotonic() + 60
        while len(stored) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stored == ["compiled:again:ok+again", "compiled:again:spin:60",
                          "compiled:again:hog", "compiled:after"]
        assert pool.stats.timeouts == 0 and pool.stats.compiles == 4
        assert pool.stats.workers_started == 2  # the spin cost its worker (the hog: caught)
    finally:
        pool.shutdown()
    pool = CompileWorkerPool(WorkerInit(backend.spec, 0), backend.receive, limits)
    try:  # no disk cache: the worker is never asked (a spin would be past the deadline)
        assert pool.submit(GrammarKey("regex", "again:spin:60")).future.result(
            timeout=60)[0] == "compiled:again:spin:60"
        assert pool.submit(GrammarKey("regex", "next")).future.result(timeout=60)[0] == \
            "compiled:next"
        assert pool.stats.workers_started == 1
    finally:
        pool.shutdown()


def test_memory_budget_and_crashes_fail_clearly_and_replace_the_worker():
    c = _compiler(memory_bytes=256 << 20)
    try:
        with pytest.raises(InvalidRequestError, match=r"more than the 268435456 bytes") as e:
            c.compile(GrammarKey("ebnf", "hog"))
        assert "grammar_compile_memory_bytes" in str(e.value) and e.value.field == "ebnf"
        with pytest.raises(InvalidRequestError, match="SIGABRT"):
            c.compile(GrammarKey("regex", "abort"))
        with pytest.raises(InvalidRequestError, match=r"crashed the grammar compiler \(SIGSEGV"):
            c.compile(GrammarKey("regex", "segv"))
        assert c.compile(GrammarKey("regex", "after")) == "compiled:after"
        stats = c.pool.stats
        assert (stats.memory_failures, stats.crashes, stats.workers_started) == (2, 1, 4)
    finally:
        c.shutdown()


def test_queue_is_bounded():
    c = _compiler(max_queued=2)
    try:
        running = c.submit(GrammarKey("regex", "sleep:3"))
        while c.pool._queue.qsize():  # wait until the worker took it
            time.sleep(0.01)
        queued = [c.submit(GrammarKey("regex", f"q{i}")) for i in range(2)]
        with pytest.raises(GrammarQueueFullError, match=r"2 compiles wait") as e:
            c.submit(GrammarKey("regex", "one too many"))
        # retryable, never a bad request
        assert "grammar_compile_queue" in str(e.value) and e.value.status == 503
        assert e.value.retry_after >= 1 and not isinstance(e.value, InvalidRequestError)
        assert running.result(wait=True) == "compiled:sleep:3"
        assert [q.result(wait=True) for q in queued] == ["compiled:q0", "compiled:q1"]
    finally:
        c.shutdown()


def test_deadline_counts_compile_work_not_wall_time():
    """A compile that sleeps (no CPU work) past its deadline is not stopped until the wall
    backstop; the deadline is the compile's CPU time."""
    c = _compiler(timeout_s=1)
    try:
        assert c.compile(GrammarKey("regex", "sleep:3")) == "compiled:sleep:3"
        assert c.pool.stats.timeouts == 0
    finally:
        c.shutdown()


def test_deadline_counts_from_the_start_of_the_compile():
    """A compile that waited for the only worker longer than the deadline still compiles: the
    deadline bounds compile work, not the wait for a worker."""
    c = _compiler(timeout_s=5)
    try:
        first = c.submit(GrammarKey("regex", "sleep:3"))
        second = c.submit(GrammarKey("regex", "sleep:3.0"))  # waits ~3 s, then compiles ~3 s
        assert first.result(wait=True) == "compiled:sleep:3"
        assert second.result(wait=True) == "compiled:sleep:3.0"
        assert c.pool.stats.timeouts == 0
        stats = c.stats_dict()
        assert stats["grammar_compile_wait_seconds"]["count"] >= 3
        assert stats["grammar_compile_queue_depth"] == 0
    finally:
        c.shutdown()


def test_expected_wait_past_the_limit_is_refused_retryably():
    """With the only worker busy and no wait allowed, a new compile is refused at once with the
    retryable queue error; the same key as the compile in flight shares it instead."""
    c = _compiler(max_wait_s=0)
    try:
        running = c.submit(GrammarKey("regex", "sleep:60"))
        with pytest.raises(GrammarQueueFullError, match="grammar_compile_max_wait_s") as e:
            c.submit(GrammarKey("regex", "waits"))
        assert e.value.status == 503 and e.value.retry_after >= 1
        shared = c.submit(GrammarKey("regex", "sleep:60"))  # identical: one compile
        assert shared.future() is running.future()
        assert c.stats.rejected_busy == 1 and c.stats_dict()["grammar_compile_rejected_busy"] == 1
    finally:
        c.shutdown()


def test_default_workers_come_from_the_cores():
    workers = PoolLimits().workers
    assert isinstance(workers, int) and 2 <= workers <= 8
    assert workers == max(2, min(len(os.sched_getaffinity(0)) - 1, 8))


def test_shutdown_leaves_no_worker_and_fails_pending():
    c = _compiler(workers=2)
    pending = c.submit(GrammarKey("regex", "sleep:60"))
    for _ in range(1000):  # both spawned (one may still be importing: it is killed as well)
        if len(pids := c.pool.worker_pids()) == 2:
            break
        time.sleep(0.01)
    assert len(pids) == 2 and all(pid_alive(p) for p in pids)
    c.shutdown()
    assert not any(pid_alive(p) for p in pids)
    with pytest.raises(InvalidRequestError):
        pending.result(wait=True)


def test_unsupported_kind_is_rejected_at_submit():
    backend = ScriptedBackend()
    backend.supports = lambda kind: kind != "ebnf"
    with pytest.raises(InvalidRequestError, match="does not support ebnf"):
        GrammarCompiler(backend).submit(GrammarKey("ebnf", "root ::= \"a\""))

"""The engine's words for dead workers (runtime/distributed/watch.py): when one tensor-parallel
rank dies the others fail and exit too, often before the watchdog looks; the report must name
the rank that died first, not rank 0's consequent exit."""
from __future__ import annotations

from dataclasses import dataclass

from sgdsl.runtime.distributed.watch import crash_text, dead_worker


@dataclass
class FakeProc:
    pid: int
    exitcode: int | None  # None: alive

    def is_alive(self) -> bool:
        return self.exitcode is None


def test_all_alive_is_none():
    assert dead_worker([FakeProc(1, None), FakeProc(2, None)]) is None


def test_a_killed_rank_is_named_before_ranks_that_failed_after_it():
    procs = [FakeProc(10, 1), FakeProc(11, -9), FakeProc(12, 1)]
    assert dead_worker(procs) == ("tensor-parallel rank 1 (pid 11)", -9)


def test_a_peer_is_named_before_rank_0_when_none_was_killed():
    assert dead_worker([FakeProc(10, 1), FakeProc(11, None), FakeProc(12, 1)]) == (
        "tensor-parallel rank 2 (pid 12)", 1)
    assert dead_worker([FakeProc(10, 1), FakeProc(11, None)]) == (
        "tensor-parallel rank 0 (pid 10)", 1)


def test_single_scheduler_process():
    assert dead_worker([FakeProc(7, -9)]) == ("scheduler process", -9)


def test_rank_0_crash_names_the_dead_peer_first():
    text = crash_text([FakeProc(10, None), FakeProc(11, -9)], "gloo: connection closed")
    assert text.startswith("tensor-parallel rank 1 (pid 11) exited unexpectedly (exit code -9)")
    assert text.endswith("rank 0 then failed: gloo: connection closed")

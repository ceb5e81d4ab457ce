"""A speculative engine that cannot speculate runs as a plain one (prediction.py), and one whose
speculation costs more than it wins turns it off (cost.py), on the scheduler's stand-in model:
outputs always equal the stand-in's greedy reference, the idle invariant holds after each test.
The cost gate is driven by a fake clock that the stand-in's forwards advance (no timing)."""
from __future__ import annotations

from sgdsl.runtime.speculative.base import Drafter, DraftTree
from sgdsl.runtime.speculative.cost import CostGate

from scheduler.conftest import make_harness  # noqa: F401 (the scheduler tests' fixture)
from scheduler.standin import expected
from speculative.test_spec_scheduler import _spec


def _trace(h) -> list[tuple]:
    """Record the scheduler's forwards and reads, in order."""
    events: list[tuple] = []
    forward, read = h.runner.forward, h.sched._read

    def traced_forward(b):
        events.append(("forward", b.mode.name, b.batch_size))
        return forward(b)

    def traced_read(step):
        events.append(("read", step.mode.name, len(step.reqs)))
        return read(step)

    h.runner.forward, h.sched._read = traced_forward, traced_read
    return events


class NeverDrafter(Drafter):
    """Predicts and proposes nothing (NGRAM on text that never repeats)."""

    def propose(self, reqs, max_tokens, hidden=None):
        return [DraftTree() for _ in reqs]

    def predict(self, reqs, max_tokens):
        return [DraftTree() for _ in reqs]


def _three(h) -> dict:
    prompts = {"a": [1, 2, 3], "b": [7, 7, 7, 7, 9], "c": [4, 11]}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=12 + len(p), ignore_eos=True)
    h.run()
    return prompts


def test_no_draft_runs_exactly_as_the_plain_overlapped_decode(make_harness):
    plain = make_harness()
    plain_events = _trace(plain)
    _three(plain)
    h = make_harness()
    _spec(h, NeverDrafter())
    events = _trace(h)
    prompts = _three(h)
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 12 + len(p)) == plain.outs[rid]
    # the same forwards, and every decode step read after the next one was launched
    assert events == plain_events
    stats = h.sched.stats()
    # one proposal, after the prefill: read anyway (nothing was running), no overlap lost
    assert stats["spec_empty_proposals"] == 1 and stats["spec_verify_steps"] == 0
    assert stats["spec_predicted_empty"] > 10


class WindowDrafter(Drafter):
    """The true continuation while ``len(all_ids) // 8`` is even, nothing otherwise; ``predict``
    applies the same rule to the ids known before the step in flight is read."""

    def propose(self, reqs, max_tokens, hidden=None):
        return [DraftTree.chain(expected(r.all_ids, max_tokens))
                if len(r.all_ids) // 8 % 2 == 0 else DraftTree() for r in reqs]

    def predict(self, reqs, max_tokens):
        return self.propose(reqs, max_tokens)


def test_speculation_resumes_when_drafts_exist(make_harness):
    h = make_harness()
    _spec(h, WindowDrafter())
    h.submit("w", [3, 1, 4], max_new_tokens=60, ignore_eos=True)
    h.run()
    assert h.outs["w"] == expected([3, 1, 4], 60)
    stats = h.sched.stats()
    assert stats["spec_verify_steps"] >= 4 and stats["spec_accepted_tokens"] > 10
    assert stats["spec_predicted_empty"] >= 4
    # a window's edge may be guessed one token late: at most a read per window lost
    assert stats["spec_empty_proposals"] <= 5


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class OracleChain(Drafter):
    """Always the true continuation (every draft accepted)."""

    def propose(self, reqs, max_tokens, hidden=None):
        return [DraftTree.chain(expected(r.all_ids, max_tokens)) for r in reqs]


def _timed(make_harness, row_cost: float):
    """A harness whose forwards advance a fake clock: 1 per forward plus ``row_cost`` per
    verify row beyond the first (a verify of 5 rows: 1 + 4 * row_cost)."""
    h = make_harness()
    _spec(h, OracleChain(), speculative_min_speedup=1.0)
    clock = h.sched.spec.cost.clock = Clock()
    forward = h.runner.forward

    def timed(b):
        clock.now += 1.0 + row_cost * max(b.batch_size - 1, 0)
        return forward(b)

    h.runner.forward = timed
    return h


def test_costly_speculation_turns_itself_off(make_harness):
    h = _timed(make_harness, row_cost=2.0)  # 5 tokens for 9 units: plain's 1 per unit wins
    h.submit("s", [2, 7], max_new_tokens=200, ignore_eos=True)
    h.run()
    assert h.outs["s"] == expected([2, 7], 200)
    stats = h.sched.stats()
    assert stats["spec_cost_losses"] >= 2 and stats["spec_cost_off_steps"] > 100
    # a few probes after each wait, most tokens from plain steps
    assert stats["spec_emitted_tokens"] < 100


def test_cheap_speculation_stays_on(make_harness):
    h = _timed(make_harness, row_cost=0.1)  # 5 tokens for 1.4 units
    h.submit("s", [2, 7], max_new_tokens=200, ignore_eos=True)
    h.run()
    assert h.outs["s"] == expected([2, 7], 200)
    stats = h.sched.stats()
    assert stats["spec_cost_losses"] == 0 and stats["spec_emitted_tokens"] > 170
    # the few plain steps that measured plain decoding's rate
    assert stats["spec_cost_off_steps"] <= 4


def test_cost_gate_intervals():
    clock = Clock()
    gate = CostGate(1.0, clock)
    forwards = 0

    def step(speculative: bool, tokens: int, dt: float, refill: bool = False) -> None:
        nonlocal forwards
        gate.tick(forwards)
        gate.launched(speculative, tokens, 1, forwards, refill)
        forwards += 1
        clock.now += dt

    for _ in range(2):
        assert gate.allow(1)
        step(True, 3, 4.0)  # 0.75 tokens per unit
    gate.tick(forwards)
    assert not gate.allow(1)  # speculative samples, no plain ones yet: measure plain
    gate.launched(False, 1, 1, forwards, refill=True)  # its interval is not counted
    forwards += 1
    clock.now += 0.1
    for _ in range(3):
        step(False, 1, 1.0)
    assert gate.plain[1].n == 2  # (bucket 1: batch 1)  # the refill's interval dropped
    step(True, 3, 4.0)
    gate.tick(forwards)
    assert gate.losses == 1 and gate.wait == 16
    assert [gate.allow(1) for _ in range(17)] == [False] * 16 + [True]
    assert gate.last_rates == (0.75, 1.0)
    step(True, 9, 10.0)  # a probe: 0.9 per unit, a close call: one sample does not decide
    gate.tick(forwards)
    assert gate.wait == 0 and gate.losses == 1
    gate.launched(True, 9, 1, forwards)
    forwards += 1
    clock.now += 10.0
    gate.tick(forwards)  # the second sample: a loss, a longer wait
    assert gate.losses == 2 and gate.wait == 32
    forwards += 5  # a prefill and more between two launches: the interval is dropped
    before = gate.spec[1].n
    gate.launched(True, 3, 1, forwards)
    gate.tick(forwards + 3)
    assert gate.spec[1].n == before
    assert CostGate(0.0).allow(1) and not CostGate(0.0).enabled

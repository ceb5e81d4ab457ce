"""A speculative engine that cannot speculate runs as a plain one (prediction.py), and one whose
speculation costs more than it wins turns it off (cost.py), on the scheduler's stand-in model:
outputs always equal the stand-in's greedy reference, the idle invariant holds after each test.
The cost gate is driven by a fake clock that the stand-in's forwards advance (no timing)."""
from __future__ import annotations

import pytest

from sgdsl.runtime.speculative.base import Drafter, DraftTree
from sgdsl.runtime.speculative.cost import CostGate

from scheduler.conftest import make_harness  # noqa: F401 (the scheduler tests' fixture)
from scheduler.standin import expected
from speculative.test_spec_scheduler import ScriptedDrafter, _spec


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


def _timed(make_harness, row_cost: float, drafter: Drafter | None = None):
    """A harness whose forwards advance a fake clock: 1 per forward plus ``row_cost`` per
    verify row beyond the first (a verify of 5 rows: 1 + 4 * row_cost)."""
    h = make_harness()
    _spec(h, drafter or OracleChain(), speculative_min_speedup=1.0)
    clock = h.sched.spec.cost.clock = Clock()
    forward = h.runner.forward

    def timed(b):
        clock.now += 1.0 + row_cost * max(b.batch_size - 1, 0)
        return forward(b)

    h.runner.forward = timed
    return h


class CatchUpOracle(OracleChain):
    """The true continuation; catching up on more tokens than one accepted chain (after a
    plain stretch, or a new request) costs ``cost`` on the clock, as a draft model's extend
    of the plain stretch's tokens or the synchronous read of the step in flight do."""

    def __init__(self, cost: float) -> None:
        self.cost, self.clock, self.seen = cost, None, {}
        self.catch_ups = 0

    def propose(self, reqs, max_tokens, hidden=None):
        for r in reqs:
            if len(r.all_ids) - self.seen.get(r.rid, -100) > max_tokens + 1:
                self.clock.now += self.cost
                self.catch_ups += 1
            self.seen[r.rid] = len(r.all_ids)
        return super().propose(reqs, max_tokens)


def test_costly_speculation_turns_itself_off(make_harness):
    h = _timed(make_harness, row_cost=2.0)  # 5 tokens for 9 units: plain's 1 per unit wins
    h.submit("s", [2, 7], max_new_tokens=200, ignore_eos=True)
    h.run()
    assert h.outs["s"] == expected([2, 7], 200)
    stats = h.sched.stats()
    # every draft was accepted and it still lost (5 tokens in 9 units at best): no acceptance
    # can pay, so one probe and off for the longest wait, not x4 waits with a probe each
    assert stats["spec_cost_losses"] == 1 and stats["spec_cost_hopeless"] == 1
    assert stats["spec_cost_ceiling_rate"] == pytest.approx(5 / 9)
    assert stats["spec_cost_off_steps"] > 150  # the rest of the request
    assert stats["spec_emitted_tokens"] <= 25  # the probe's four steps


def test_low_acceptance_loss_is_probed_again(make_harness):
    # one draft token of four accepted: 2 tokens for 3 units loses to plain's 1 per unit,
    # but full acceptance (5 tokens for 3 units) would win: waits x4, probes again
    h = _timed(make_harness, row_cost=0.5, drafter=ScriptedDrafter(wrong_at=1))
    h.submit("s", [2, 7], max_new_tokens=200, ignore_eos=True)
    h.run()
    assert h.outs["s"] == expected([2, 7], 200)
    stats = h.sched.stats()
    assert stats["spec_cost_losses"] >= 2 and stats["spec_cost_hopeless"] == 0
    assert stats["spec_cost_ceiling_rate"] == pytest.approx(5 / 3)
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


def _stepper(gate: CostGate, clock: Clock):
    forwards = [0]

    def step(speculative: bool, tokens: int, dt: float, refill: bool = False) -> None:
        gate.tick(forwards[0])
        gate.launched(speculative, tokens, 1, forwards[0], refill)
        forwards[0] += 1
        clock.now += dt

    return step, forwards


def test_cost_gate_intervals():
    clock = Clock()
    gate = CostGate(1.0, clock)
    step, forwards = _stepper(gate, clock)
    for _ in range(3):
        assert gate.allow(1)
        step(True, 3, 4.0)  # 0.75 tokens per unit (the first interval: not steady, dropped)
    gate.tick(forwards[0])
    assert gate.spec[1].n == 2 and gate.dropped == 1
    assert not gate.allow(1)  # speculative samples, no plain ones yet: measure plain
    gate.launched(False, 1, 1, forwards[0], refill=True)  # its interval is not counted
    forwards[0] += 1
    clock.now += 0.1
    for _ in range(3):
        step(False, 1, 1.0)
    assert gate.plain[1].n == 2  # (bucket 1: batch 1)  # the refill's interval dropped
    step(True, 3, 4.0)  # after plain steps: dropped
    step(True, 3, 4.0)
    gate.tick(forwards[0])
    # the probe (5 intervals: 15 tokens in 20 units; plain: 1 per unit) lost 5 units, 3% of
    # 166 plain steps: off longer than the first penalty (16), up to the next one (64)
    assert gate.losses == 1 and gate.wait == 64 and gate.dropped == 2
    assert gate.last_rates == (pytest.approx(0.75), pytest.approx(1.0))
    forwards[0] += 5  # a prefill and more between two launches: the interval is dropped
    before = gate.spec[1].n
    gate.launched(True, 3, 1, forwards[0])
    gate.tick(forwards[0] + 3)
    assert gate.spec[1].n == before
    assert CostGate(0.0).allow(1) and not CostGate(0.0).enabled


def test_one_off_cost_after_a_plain_stretch_is_not_a_loss(make_harness):
    # steady: 5 tokens for 1.4 units; the first speculative step after plain steps pays 30
    # more (one such interval alone read as a clear loss: the waits grew while it won)
    drafter = CatchUpOracle(cost=30.0)
    h = _timed(make_harness, row_cost=0.1, drafter=drafter)
    drafter.clock = h.sched.spec.cost.clock
    h.submit("s", [2, 7], max_new_tokens=200, ignore_eos=True)
    h.run()
    assert h.outs["s"] == expected([2, 7], 200)
    stats = h.sched.stats()
    assert drafter.catch_ups >= 2  # the first proposal, and the one after the plain samples
    assert stats["spec_cost_losses"] == 0 and stats["spec_cost_first_dropped"] >= 2
    assert stats["spec_emitted_tokens"] > 170 and stats["spec_cost_off_steps"] <= 4


def test_cost_gate_verdicts_need_two_steady_samples():
    clock = Clock()
    gate = CostGate(1.0, clock)
    step, forwards = _stepper(gate, clock)
    for _ in range(3):  # plain rate: 1 token per unit
        step(False, 1, 1.0)
    for dt in (50.0, 4.0):  # a probe: its first interval (after plain) costs 50: dropped;
        step(True, 3, dt)  # then one steady loss (0.75 per unit): not a verdict yet
    gate.tick(forwards[0])
    assert gate.dropped == 1 and gate.spec[1].n == 1 and gate.losses == 0
    gate.launched(True, 3, 1, forwards[0])
    forwards[0] += 1
    clock.now += 4.0
    gate.tick(forwards[0])  # the second steady loss decides: a loss
    # the probe's cost counts, its one-off included (9 tokens in 58 units: 49 lost), in how
    # long it is off: up to the next penalty (49 / 0.03 plain steps would be 3%)
    assert gate.losses == 1 and gate.wait == 64
    assert [gate.allow(1) for _ in range(65)] == [False] * 64 + [True]
    gate.launched(False, 1, 1, forwards[0])
    forwards[0] += 1
    clock.now += 1.0
    # the probe after the wait: a costly first interval, then steady wins (9 tokens per 5)
    for dt in (100.0, 5.0, 5.0, 5.0):
        step(True, 9, dt)
    gate.tick(forwards[0])
    assert gate.losses == 1 and gate.wait == 0 and gate.dropped == 2
    assert gate.last_rates[0] == pytest.approx(9 / 5) and gate.allow(1)
    # then steadily losing (1 token per 4 units): off within a few steps, the wins having
    # halved the penalty back to its first wait
    gate.launched(True, 1, 1, forwards[0])
    forwards[0] += 1
    for n in range(1, 5):
        step(True, 1, 4.0)
        if gate.losses == 2:
            break
    # (the intervals since the last verdict, a win: one, 1 token in 4 units: 3 lost, 3% of
    # 100 steps; the penalty, 64 after the first loss, was halved twice by the wins)
    assert n > 1 and gate.losses == 2 and gate.wait == 64
    # rates are ratios of sums: a 1-token interval weighs as little as it produced
    rate = CostGate(1.0).spec.setdefault(1, type(gate.spec[1])())
    rate.add(1, 1.0)
    rate.add(5, 1.0)
    assert rate.value == (0.75 * 1 + 5) / (0.75 + 1)

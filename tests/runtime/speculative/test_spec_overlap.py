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
    # can pay, so one probe and off for the longest wait
    assert stats["spec_cost_hopeless"] == 1 and stats["spec_cost_ratio"] == pytest.approx(9)
    assert stats["spec_cost_ceiling_rate"] == pytest.approx(5 / 9)
    assert stats["spec_cost_off_steps"] > 150  # the rest of the request
    assert stats["spec_emitted_tokens"] <= 25  # the probe's four steps


def test_low_acceptance_request_backs_off_and_is_probed_again(make_harness):
    # one draft token of four accepted: 2 tokens for 3 units loses to plain's 1 per unit,
    # but full acceptance (5 tokens for 3 units) would win: the request waits (1, 2, 4, ...
    # steps), probes again, and the gate's bar is what a verify needs here (2 accepted)
    h = _timed(make_harness, row_cost=0.5, drafter=ScriptedDrafter(wrong_at=1))
    h.submit("s", [2, 7], max_new_tokens=200, ignore_eos=True)
    h.run()
    assert h.outs["s"] == expected([2, 7], 200)
    stats = h.sched.stats()
    assert stats["spec_cost_hopeless"] == 0 and stats["spec_cost_ratio"] == pytest.approx(3)
    assert stats["spec_cost_ceiling_rate"] == pytest.approx(5 / 3)
    assert h.sched.spec.cost.accept_bar(1) == pytest.approx(2)
    assert 4 <= stats["spec_verify_steps"] <= 20 and stats["spec_emitted_tokens"] < 60


def test_cheap_speculation_stays_on(make_harness):
    h = _timed(make_harness, row_cost=0.1)  # 5 tokens for 1.4 units
    h.submit("s", [2, 7], max_new_tokens=200, ignore_eos=True)
    h.run()
    assert h.outs["s"] == expected([2, 7], 200)
    stats = h.sched.stats()
    assert stats["spec_cost_losses"] == 0 and stats["spec_emitted_tokens"] > 170
    # the few plain steps that measured plain decoding's cost
    assert stats["spec_cost_off_steps"] <= 4


class PerRequest(ScriptedDrafter):
    """The true continuation, wrong from position ``wrong_at[rid's first letter]`` on."""

    def __init__(self, wrong_at: dict) -> None:
        super().__init__()
        self.by_rid = wrong_at

    def propose(self, reqs, max_tokens, hidden=None):
        out = []
        for req in reqs:
            self.wrong_at = self.by_rid[req.rid[0]]
            out += super().propose([req], max_tokens)
        return out


def test_one_requests_losing_phase_keeps_no_other_plain(make_harness):
    # issue 25 row (b) on the H200: a steady verify step of 5 rows took 1.95 ms against
    # 0.70 ms for a plain step (a ratio of 2.8: row_cost 0.45). Copy prompts alternate with
    # a prompt the model stops copying (NGRAM accepts nothing); the old gate's waits after
    # the loser's losses ran on into the next prompt (480 of ~620 steps plain, 1.28x)
    h = _timed(make_harness, row_cost=0.45, drafter=PerRequest({"l": 0, "c": None}))
    per: dict = {}
    for rid in ("l0", "c0", "l1", "c1"):
        before, t0 = h.sched.stats(), h.sched.spec.cost.clock.now
        h.submit(rid, [3, len(rid), int(rid[1])], max_new_tokens=60, ignore_eos=True)
        h.run()
        assert h.outs[rid] == expected([3, len(rid), int(rid[1])], 60)
        after = h.sched.stats()
        per[rid] = {k: after[k] - before[k] for k in ("spec_verify_steps", "spec_emitted_tokens",
                                                      "spec_cost_off_steps")}
        per[rid]["units"] = h.sched.spec.cost.clock.now - t0
    for rid in ("c0", "c1"):  # the copies speculate from their first step on
        assert per[rid]["spec_emitted_tokens"] >= 55, per
        # 5 tokens per 2.8 units (12 verifies: 33.6) and a prefill; plain: 60 units
        assert per[rid]["units"] < 0.6 * 60, per
    for rid in ("l0", "l1"):  # the loser only probes, on its own doubling waits
        assert per[rid]["spec_verify_steps"] <= 8, per
        assert per[rid]["units"] < 1.35 * 60, per
    assert h.sched.spec.cost.accept_bar(1) == pytest.approx(1.8)  # (1 + 4 * 0.45) - 1


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
        assert gate.allow(1, 5.0)
        step(True, 3, 4.0)  # (the first interval: not steady, dropped)
    gate.tick(forwards[0])
    bucket = gate.buckets[1]  # (bucket 1: batch 1)
    assert bucket.spec.n == 2 and gate.dropped == 1 and bucket.ratio is None
    assert not gate.allow(1, 5.0)  # speculative samples, no plain ones yet: measure plain
    gate.launched(False, 1, 1, forwards[0], refill=True)  # its interval is not counted
    forwards[0] += 1
    clock.now += 0.1
    for _ in range(3):
        step(False, 1, 1.0)
    assert bucket.plain.n == 2 and bucket.ratio == pytest.approx(4.0)
    assert gate.accept_bar(1) == pytest.approx(3.0) and gate.accept_bar(4) == 0.0
    assert gate.last_rates == (pytest.approx(0.75), pytest.approx(1.0))
    # 4 tokens expected per request and step: pays a 4x step; 3.9 does not
    assert gate.allow(1, 4.0) and not gate.allow(1, 3.9) and gate.losses == 1
    assert gate.allow(1, None)  # nothing known of the requests: measured
    forwards[0] += 5  # a prefill and more between two launches: the interval is dropped
    before = bucket.spec.n
    gate.launched(True, 3, 1, forwards[0])
    gate.tick(forwards[0] + 3)
    assert bucket.spec.n == before
    assert CostGate(0.0).allow(1, 0.0) and not CostGate(0.0).enabled


def test_cost_gate_ratio_from_the_gpu_step_times():
    # the H200's figures of issue 25 row (b) (ms): plain 0.70 a step, a speculative step's
    # first interval after plain steps 2.786 (dropped), its steady ones 1.953
    clock = Clock()
    gate = CostGate(1.0, clock, draft_tokens=4, proposal_cost=0.0)
    step, forwards = _stepper(gate, clock)
    for _ in range(4):
        step(False, 1, 0.70)
    step(True, 5, 2.786)
    for _ in range(3):
        step(True, 5, 1.953)
    gate.tick(forwards[0])
    assert gate.last_ratio == pytest.approx(1.953 / 0.70) and gate.hopeless == 0
    bar = gate.accept_bar(1)
    assert bar == pytest.approx(1.953 / 0.70 - 1)
    # per prompt, tokens per verify (1 + accepted) on that run: 4.41 pays, 1.08 does not;
    # the verdict is per step from the requests running, never a wait carried over
    assert gate.allow(1, 4.41) and not gate.allow(1, 1.08) and gate.allow(1, 4.41)
    assert gate.allow(1, 1 + bar)  # a request's fresh start (its average at the bar)
    # the step times are decided again as samples come (every _REDECIDE): a verify as cheap
    # as a plain step makes a low acceptance pay (the older samples decay: 0.75 each)
    for _ in range(8):
        step(True, 5, 0.70)
    gate.tick(forwards[0])
    assert gate.last_ratio < 1.2 and gate.allow(1, 1.2)


def test_plain_steps_read_at_once_are_measured():
    # grammar rows (or overlap off): every plain step is read right away, so each is launched
    # with nothing in flight; the first after a speculative step is dropped, the next ones are
    # what a plain step costs there (the old gate dropped them all: after its speculative
    # samples it ran plain steps to measure plain decoding, for ever)
    clock = Clock()
    gate = CostGate(1.0, clock, draft_tokens=4)
    step, forwards = _stepper(gate, clock)
    for _ in range(3):  # the first dropped, two samples
        step(True, 5, 2.0)
    gate.tick(forwards[0])
    for _ in range(3):
        assert not gate.allow(1, 5.0)
        gate.launched(False, 1, 1, forwards[0], refill=True)
        forwards[0] += 1
        clock.now += 1.0
        gate.tick(forwards[0])
    assert gate.buckets[1].plain.n == 2 and gate.last_ratio == pytest.approx(2.0)
    assert gate.allow(1, 5.0) and not gate.allow(1, 1.5)

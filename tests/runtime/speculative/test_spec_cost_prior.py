"""A drafter that cannot pay even with every draft accepted is probed rarely (cost.py's prior and
hopeless verdicts), not banned: the scheduler's stand-in model with a fake clock (no timing),
outputs equal to the stand-in's greedy reference; and STANDALONE's prior from the model
configs (the model drafting for itself: a proposal costs at least ``num_steps`` target steps)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sgdsl.runtime.speculative.cost import CostGate, _MAX_WAIT

from scheduler.conftest import make_harness  # noqa: F401 (the scheduler tests' fixture)
from scheduler.standin import expected
from speculative.test_spec_overlap import Clock, OracleChain, _timed


class SelfDraft(OracleChain):
    """Every draft accepted, but each proposal known to cost ``cost`` target steps (a draft
    model as large as the target: ``num_steps`` forwards)."""

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.proposals = 0

    def propose(self, reqs, max_tokens, hidden=None):
        self.proposals += 1
        return super().propose(reqs, max_tokens)

    def proposal_cost(self) -> float:
        return self.cost


def test_prior_ceiling_decides_the_first_wait():
    hopeless = CostGate(1.0, Clock(), draft_tokens=4, proposal_cost=4.0)  # 5 tokens / 5 steps
    assert hopeless.prior_ceiling == 1.0 and hopeless.hopeless == 1
    assert [hopeless.allow(1) for _ in range(_MAX_WAIT + 1)] == [False] * _MAX_WAIT + [True]
    cheap = CostGate(1.0, Clock(), draft_tokens=4, proposal_cost=0.6)  # at best 5 / 1.6
    assert cheap.prior_ceiling == pytest.approx(5 / 1.6) and cheap.allow(1)
    assert cheap.hopeless == 0
    # a lower bar (speculation may cost up to 10%) lets a tie through; the gate off: no prior
    assert CostGate(0.9, Clock(), draft_tokens=4, proposal_cost=4.0).allow(1)
    assert CostGate(0.0, Clock(), draft_tokens=4, proposal_cost=4.0).allow(1)
    assert CostGate(1.0, Clock(), draft_tokens=4).prior_ceiling is None


def test_prior_is_not_a_ban():
    # after the prior's wait, a probe that measures a win (the device's costs said otherwise)
    # keeps speculating
    clock = Clock()
    gate = CostGate(1.0, clock, draft_tokens=4, proposal_cost=4.0)
    forwards, allowed = [0], []
    for _ in range(_MAX_WAIT + 20):
        gate.tick(forwards[0])
        speculate = gate.allow(1)
        allowed.append(speculate)
        gate.launched(speculate, 5 if speculate else 1, 1, forwards[0])
        forwards[0] += 1
        clock.now += 2.0 if speculate else 1.0  # 5 tokens in 2 units vs 1 per unit
    assert allowed[:_MAX_WAIT] == [False] * _MAX_WAIT and all(allowed[_MAX_WAIT:])
    assert gate.losses == 0 and gate.last_rates == (pytest.approx(2.5), pytest.approx(1.0))


def test_hopeless_verdicts_hold_per_batch_size():
    clock = Clock()
    gate = CostGate(1.0, clock, draft_tokens=4)  # no prior: measured
    forwards = [0]

    def step(speculative: bool, tokens: int, dt: float) -> None:
        gate.tick(forwards[0])
        gate.launched(speculative, tokens, 1, forwards[0])
        forwards[0] += 1
        clock.now += dt

    for _ in range(3):
        step(False, 1, 1.0)  # plain: 1 token per unit
    for _ in range(3):  # every draft accepted, 5 tokens in 6 units: the ceiling loses too
        step(True, 5, 6.0)
    gate.tick(forwards[0])
    assert gate.hopeless == 1 and gate.last_ceiling == pytest.approx(5 / 6)
    assert gate.last_ratio == pytest.approx(6.0)
    assert gate.blocked[1] >= _MAX_WAIT and not gate.allow(1)
    # another batch size was not measured: its own probe comes (a request's low acceptance,
    # by contrast, backs off that request only: stats.Backoff)
    assert gate.allow(4)
    # the prior: every batch size waits before its first probe
    prior = CostGate(1.0, Clock(), draft_tokens=4, proposal_cost=4.0)
    assert not any(prior.allow(1) for _ in range(_MAX_WAIT)) and not prior.allow(8)
    assert prior.allow(1) and prior.off_steps == _MAX_WAIT + 1


def test_hopeless_drafter_never_speculates_in_short_requests(make_harness):
    # as costly on the clock as the prior says (4 draft rows + a verify of 5 per proposal)
    drafter = SelfDraft(cost=4.0)
    h = _timed(make_harness, row_cost=1.0, drafter=drafter)
    prompts = {f"r{i}": [2 + i, 7, 1 + i] for i in range(4)}
    for rid, p in prompts.items():  # one after another: the gate's wait spans requests
        h.submit(rid, p, max_new_tokens=40, ignore_eos=True)
        h.run()
        assert h.outs[rid] == expected(p, 40)
    stats = h.sched.stats()
    assert drafter.proposals == 0 and stats["spec_verify_steps"] == 0
    assert stats["spec_cost_hopeless"] == 1 and stats["spec_cost_losses"] == 0
    assert stats["spec_cost_prior_ceiling"] == 1.0
    assert stats["spec_cost_off_steps"] == 4 * 39  # every decode step plain
    assert stats["spec_empty_proposals"] == 0  # never read a step in flight for a draft


def test_forward_cost_ratio_of_draft_models():
    from sgdsl.runtime.model.model_config import ModelConfig
    from sgdsl.runtime.speculative.standalone import forward_cost_ratio

    configs = Path(__file__).parents[3] / "benchmarks" / "gpu" / "configs"
    llama8b = ModelConfig.from_dir(configs / "llama-3.1-8b")
    assert forward_cost_ratio(llama8b, llama8b) == 1.0  # issue 25 row (a): drafting for itself
    gate = CostGate(1.0, Clock(), draft_tokens=4, proposal_cost=4 * 1.0)
    assert gate.prior_ceiling == 1.0 and not gate.allow(1)  # probed after the longest wait
    # a smaller draft of the same family: its bytes decide (24 layers of 28, a third of them)
    small = forward_cost_ratio(ModelConfig.from_dir(configs / "qwen2.5-0.5b"),
                               ModelConfig.from_dir(configs / "qwen2.5-1.5b"))
    assert 0.2 < small < 0.45
    assert CostGate(1.0, Clock(), draft_tokens=4, proposal_cost=4 * small).allow(1)
    half = dataclasses.replace(llama8b, num_layers=16)
    assert forward_cost_ratio(half, llama8b) == pytest.approx(0.5, abs=0.02)
    # wider but shallower: bounded by the smaller ratio (a launch-bound forward's layers)
    wide = dataclasses.replace(half, intermediate_size=4 * llama8b.intermediate_size)
    assert forward_cost_ratio(wide, llama8b) == pytest.approx(0.5)
    assert forward_cost_ratio(llama8b, half) > 1  # a draft larger than the target
    # an fp8 draft of the bf16 target reads half the bytes its config says: no bound
    fp8 = dataclasses.replace(llama8b, quantization_config={"quant_method": "fp8"})
    assert forward_cost_ratio(fp8, llama8b) is None

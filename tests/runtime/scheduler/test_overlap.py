"""Overlap scheduling (step t's tokens read after step t+1 was launched) changes nothing visible:
outputs and finish reasons match the non-overlapped scheduler, on the stand-in model through
chunking, cache hits, retraction, EOS stops and aborts in flight, and on a tiny random Llama
through the real ModelRunner with greedy and seeded sampling. The idle invariant is checked
after every test (``make_harness``)."""
from __future__ import annotations

import random

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.scheduler import Scheduler

from .standin import expected


def _workload(h, seed: int = 0) -> dict:
    """Mixed lengths, a shared prefix, some requests allowed to stop at EOS (token 0)."""
    rng = random.Random(seed)
    shared = [rng.randrange(1, 50) for _ in range(20)]
    prompts = {}
    for i in range(12):
        body = [rng.randrange(1, 50) for _ in range(rng.randrange(2, 30))]
        prompts[f"r{i}"] = (shared + body) if i % 3 == 0 else body
        h.submit(f"r{i}", prompts[f"r{i}"], max_new_tokens=rng.randrange(1, 25),
                 ignore_eos=i % 2 == 0)
    return prompts


def _run_counting_overlap(h) -> int:
    """Run to idle; count steps after which a launched step was left unread."""
    deferred = 0
    for _ in range(10_000):
        if not h.sched.step():
            return deferred
        deferred += h.sched.pending is not None
    raise AssertionError("scheduler did not become idle")


@pytest.mark.parametrize("num_slots", [512, 90])  # 90: tight, decode must retract
def test_overlap_matches_sync_scheduling(make_harness, num_slots):
    results = {}
    for overlap in (False, True):
        h = make_harness(num_slots=num_slots, max_reqs=8, chunked_prefill_size=24,
                         disable_overlap_schedule=not overlap)
        prompts = _workload(h)
        deferred = _run_counting_overlap(h)
        assert (deferred > 0) == overlap  # overlap really read steps one launch late
        results[overlap] = (h.outs, h.finish, h.sched.counters["retractions_total"])
        for rid, p in prompts.items():  # and the tokens are the model's
            n = len(h.outs[rid])
            assert h.outs[rid] == expected(p, n)
            if h.finish[rid]["type"] == "stop":
                assert h.outs[rid][-1] == 0
    assert results[True][:2] == results[False][:2]
    if num_slots == 90:
        assert results[True][2] > 0 and results[False][2] > 0


def test_overlap_keeps_max_running(make_harness):
    # Requests prefilled by the step in flight count as running before that step is read.
    h = make_harness(max_reqs=16, max_running_requests=4)
    for i in range(12):
        h.submit(f"r{i}", [i + 1] * (3 + i), max_new_tokens=6, ignore_eos=True)
    h.run()
    assert all(len(h.outs[f"r{i}"]) == 6 for i in range(12))
    assert max(b.batch_size for b in h.runner.forwards if b.mode.is_decode) == 4


def test_abort_while_prefill_and_decode_are_in_flight(make_harness):
    h = make_harness()
    h.submit("a", [1, 2, 3], max_new_tokens=30, ignore_eos=True)
    h.submit("b", [4, 5, 6, 7], max_new_tokens=30, ignore_eos=True)
    h.sched.step()  # prefill of a and b launched, not read
    assert h.sched.pending is not None and h.sched.pending.mode.value == "extend"
    h.sched.handle(m.AbortReq("a", "stop it"))
    h.sched.step()  # reads the prefill: only b joins the decode batch
    assert [r.rid for r in h.sched.running.reqs] == ["b"]
    h.sched.step()
    assert h.sched.pending is not None and h.sched.pending.mode.value == "decode"
    h.sched.handle(m.AbortReq("b", "stop it too"))
    assert h.sched.is_idle  # nothing left to read from the decode in flight
    assert h.finish == {"a": {"type": "abort", "message": "stop it"},
                        "b": {"type": "abort", "message": "stop it too"}}
    h.submit("c", [1, 2, 3], max_new_tokens=5, ignore_eos=True)  # reuses the freed rows
    h.run()
    assert h.outs["c"] == expected([1, 2, 3], 5)


@pytest.fixture(scope="module")
def tiny_runner(tiny_model_dir):
    from sgdsl.runtime.model.runner import ModelRunner

    return ModelRunner(EngineConfig(model=str(tiny_model_dir), load_format="dummy",
                                    max_total_tokens=600, max_running_requests=8,
                                    num_threads=1, device="cpu"))


def _run_real(runner, overlap: bool) -> dict:
    config = EngineConfig(max_running_requests=8, chunked_prefill_size=32, grammar_backend="none",
                          disable_overlap_schedule=not overlap)
    outs: dict = {}
    sched = Scheduler(runner, config, [2], None,
                      lambda msg: [outs.setdefault(o.rid, []).extend(o.new_ids) for o in msg.outs])
    gen = torch.Generator().manual_seed(0)
    for i in range(6):
        ids = torch.randint(3, 1000, (int(torch.randint(3, 60, (1,), generator=gen)),),
                            generator=gen).tolist()
        sampled = dict(temperature=0.8, top_p=0.9, seed=i) if i % 2 else dict(temperature=0.0)
        params = SamplingParams(max_new_tokens=10 + 3 * i, ignore_eos=True, **sampled)
        sched.handle(m.TokenizedGenerateReq(f"r{i}", ids, params))
    while sched.step():
        pass
    assert sched._integrity_resp(0).ok
    sched.memory.flush()  # the next run starts from an empty cache
    return outs


def test_overlap_matches_sync_on_a_real_model(tiny_runner):
    sync, overlapped = _run_real(tiny_runner, False), _run_real(tiny_runner, True)
    assert sorted(sync) == [f"r{i}" for i in range(6)]
    assert all(len(sync[f"r{i}"]) == 10 + 3 * i for i in range(6))
    assert overlapped == sync

"""Scheduler tests on the deterministic stand-in model (see conftest): batching, LPM ordering,
chunked prefill, cache hits, retraction, aborts, logprobs and finish conditions. Every test
ends with the idle invariant (the ``make_harness`` fixture checks it)."""
from __future__ import annotations

import math

import torch

from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.scheduler.finish import FinishChecker

from .standin import VOCAB, expected, next_token


def test_mixed_length_batch_matches_reference(make_harness):
    h = make_harness()
    prompts = {"a": [1, 2, 3, 4, 5], "b": [9, 8], "c": list(range(3, 30))}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=7, ignore_eos=True)
    h.run()
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 7)
        assert h.finish[rid] == {"type": "length", "length": 7}
    assert h.runner.forwards[0].batch_size == 3  # one prefill batch, then shared decode steps


def test_cache_hit_skips_prefix(make_harness):
    h = make_harness()
    prompt = list(range(1, 21))
    h.submit("a", prompt, max_new_tokens=3, ignore_eos=True)
    h.run()
    h.submit("b", prompt + [7, 7], max_new_tokens=3, ignore_eos=True)
    h.run()
    assert h.outs["b"] == expected(prompt + [7, 7], 3)
    last_prefill = [b for b in h.runner.forwards if not b.mode.is_decode][-1]
    assert last_prefill.extend_prefix_lens_cpu == [20]  # the whole prompt of "a" was cached
    assert h.sched.stats()["cache_hit_tokens"] == 20


def test_chunked_prefill(make_harness):
    h = make_harness(chunked_prefill_size=16)
    prompt = [(i * 5) % 40 + 1 for i in range(40)]
    h.submit("long", prompt, max_new_tokens=4, ignore_eos=True)
    h.run()
    assert h.outs["long"] == expected(prompt, 4)
    chunks = [b.extend_seq_lens_cpu[0] for b in h.runner.forwards if not b.mode.is_decode]
    assert chunks == [16, 16, 8]


def _first_output_order(h) -> list[str]:
    seen = []
    for rid in h.order:
        if rid not in seen:
            seen.append(rid)
    return seen


def test_lpm_prefers_cached_prefix_and_fcfs_does_not(make_harness):
    shared = list(range(1, 17))
    for policy, want in (("lpm", ["warm", "hit", "miss"]), ("fcfs", ["warm", "miss", "hit"])):
        # Budget 16: one new prompt per prefill batch, so the queue order decides.
        h = make_harness(chunked_prefill_size=17, schedule_policy=policy)
        h.submit("warm", shared, max_new_tokens=1)
        h.run()
        h.submit("miss", [40 + i % 5 for i in range(16)], max_new_tokens=1)
        h.submit("hit", shared + [3], max_new_tokens=1)
        h.run()
        assert _first_output_order(h) == want, policy


def test_retraction_resumes_with_identical_output(make_harness):
    # 40 slots, 3 requests needing 8 + 24 each: decode runs out of KV and must retract.
    h = make_harness(num_slots=40, ratio=0.0)
    prompts = {f"r{i}": [i + 1] * 8 for i in range(3)}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=24, ignore_eos=True)
    h.run()
    assert h.sched.counters["retractions_total"] > 0
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 24), rid


def test_abort_waiting_chunked_and_decoding(make_harness):
    h = make_harness(chunked_prefill_size=8)
    h.submit("decoding", [1, 2, 3], max_new_tokens=50, ignore_eos=True)
    h.sched.step()  # prefill "decoding"
    h.submit("chunked", list(range(1, 30)), max_new_tokens=5)
    h.submit("waiting", [4, 5, 6], max_new_tokens=5)
    h.sched.step()  # first chunk of "chunked"; "waiting" has no budget left
    assert h.sched.chunked is not None and h.sched.chunked.rid == "chunked"
    assert [r.rid for r in h.sched.waiting] == ["waiting"]
    for rid in ("waiting", "chunked", "decoding"):
        h.sched.handle(m.AbortReq(rid, "test abort"))
        assert h.finish[rid] == {"type": "abort", "message": "test abort"}
    assert h.sched.is_idle
    h.sched.handle(m.AbortReq("unknown"))  # unknown rid: ignored
    h.submit("after", [1, 2], max_new_tokens=3, ignore_eos=True)
    h.run()
    assert h.outs["after"] == expected([1, 2], 3)


def _ref_logprob(seq: list[int], token: int) -> float:
    logits = -0.5 * (torch.arange(VOCAB) - next_token(seq)).abs().float()
    return float(torch.log_softmax(logits, -1)[token])


def test_prompt_logprobs_chunked_and_prefill_only(make_harness):
    h = make_harness(chunked_prefill_size=8)
    prompt = list(range(2, 22))
    h.submit("warm", prompt, max_new_tokens=1)  # caches the prompt: logprobs must recompute
    h.run()
    h.submit("lp", prompt, max_new_tokens=0, return_logprob=True, logprob_start_len=3,
             top_logprobs_num=2)
    h.run()
    assert h.finish["lp"] == {"type": "length", "length": 0} and h.outs["lp"] == []
    got = h.last["lp"]["in"]
    assert [t for _, t in got] == prompt[3:]
    for (lp, tok), i in zip(got, range(3, len(prompt))):
        assert math.isclose(lp, _ref_logprob(prompt[:i], tok), rel_tol=1e-5)


def test_output_logprobs_and_start_zero(make_harness):
    h = make_harness()
    h.submit("x", [5, 6, 7], max_new_tokens=3, ignore_eos=True, return_logprob=True,
             logprob_start_len=0)
    h.run()
    assert h.last["x"]["in"][0] == (None, 5)
    outs = h.last["x"]["out"]
    seq = [5, 6, 7]
    for lp, tok in outs:
        assert math.isclose(lp, _ref_logprob(seq, tok), rel_tol=1e-5)
        seq.append(tok)


def test_stop_token_ids_and_min_new_tokens(make_harness):
    h = make_harness()
    prompt = [1, 2, 3, 4]
    ref = expected(prompt, 10)
    h.submit("stop", prompt, max_new_tokens=10, stop_token_ids=[ref[2]], ignore_eos=True)
    h.submit("max", prompt, max_new_tokens=4, ignore_eos=True)
    h.run()
    assert h.outs["stop"] == ref[:3]
    assert h.finish["stop"] == {"type": "stop", "matched": ref[2]}
    assert h.outs["max"] == ref[:4]


def test_min_new_tokens_masks_stop_tokens(make_harness):
    h = make_harness()
    prompt = [1, 2, 3, 4]
    ref = expected(prompt, 10)
    h.submit("min", prompt, max_new_tokens=10, stop_token_ids=[ref[0]], min_new_tokens=3,
             ignore_eos=True)
    h.run()
    assert len(h.outs["min"]) >= 3
    assert ref[0] not in h.outs["min"][:3]


def test_finish_checker_stop_strings():
    decode = lambda ids: "".join(chr(ord("a") + i % 26) for i in ids)  # noqa: E731
    checker = FinishChecker([0], decode)
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.scheduler.req import Req

    req = Req("s", [1], SamplingParams(stop=("cde", "zz"), max_new_tokens=10))
    results = []
    for tok in (1, 2, 3, 4, 5):  # b c d e f
        req.output_ids.append(tok)
        results.append(checker.check(req))
    assert results[:3] == [None, None, None]
    assert results[3] == {"type": "stop", "matched": "cde"}


def test_in_batch_shared_prefix_is_computed_once(make_harness):
    h = make_harness()
    shared = [(i * 3) % 40 + 1 for i in range(64)]
    prompts = {f"q{i}": shared + [i + 1, i + 2] for i in range(4)}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=2, ignore_eos=True)
    h.run()
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 2)
    prefills = [b for b in h.runner.forwards if not b.mode.is_decode]
    assert prefills[0].extend_seq_lens_cpu == [66]  # the others waited for the shared prefix
    assert sorted(prefills[1].extend_prefix_lens_cpu) == [64, 64, 64]


def test_plain_requests_report_once_streams_every_step(make_harness):
    h = make_harness()
    h.submit("plain", [1, 2, 3], max_new_tokens=5, ignore_eos=True, stream=False)
    h.submit("streamed", [1, 2, 4], max_new_tokens=5, ignore_eos=True)
    h.run()
    assert h.order.count("plain") == 1 and h.outs["plain"] == expected([1, 2, 3], 5)
    assert h.order.count("streamed") == 5 and h.outs["streamed"] == expected([1, 2, 4], 5)

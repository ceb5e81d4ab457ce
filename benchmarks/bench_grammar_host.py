"""Host cost of a constrained decode step's grammar work, without a GPU (issue 15, item 5).

Drives a ``GrammarManager`` the way the scheduler does with overlap scheduling (prefetch, then
``after_sample``, then ``fill_bitmask``) for a batch of requests under the GPU
structured-decode benchmark's schema and tokenizer (Llama-3.1, 128k vocab), with a stand-in
sampler: per row a fixed random score per token, shifted each step, argmax over the allowed
tokens (a greedy decode of an untrained model picks similarly arbitrary tokens). Sampling time
is not counted. Prints per decode step: the scheduler thread's time in ``after_sample`` (the
prefetch wait included), in ``fill_bitmask``, the completion tracker's share, rows measured by
it, searches, and forced completions; with ``--profile`` the top functions of the tracker.

    python benchmarks/bench_grammar_host.py --batch 256 --max-new 96
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "gpu"))
from bench_structured_decode import SCHEMA  # noqa: E402
from common import model_dir  # noqa: E402


def _manager(model: str, backend: str, jump_forward: bool = False):
    from transformers import AutoTokenizer

    from sgdsl.runtime.grammar.manager import GrammarManager
    from sgdsl.runtime.grammar.registry import create_grammar_backend

    tok = AutoTokenizer.from_pretrained(model_dir(model))
    config = json.loads(Path(model_dir(model), "config.json").read_text())
    eos = config["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    vocab = config["vocab_size"]
    grammar_backend = create_grammar_backend(backend, tok, vocab, eos)
    mgr = GrammarManager(grammar_backend, tok, vocab, eos, jump_forward=jump_forward)
    return mgr, eos, vocab


def _requests(mgr, n: int, max_new: int, eos: list[int]):
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.scheduler.finish import FinishChecker
    from sgdsl.runtime.scheduler.req import Req

    params = SamplingParams(max_new_tokens=max_new, json_schema=json.dumps(SCHEMA))
    reqs = [Req(f"r{i}", [1, 2, 3], params) for i in range(n)]
    for req in reqs:
        mgr.admit(req)
    while mgr.pending:
        mgr.wait_pending(1.0)
        ready, failed = mgr.poll()
        assert not failed, failed
    return reqs, FinishChecker(eos, None)


def _sample(scores: torch.Tensor, mask: torch.Tensor, step: int, vocab: int) -> list[int]:
    from sgdsl.runtime.layers.bitmask import unpack_bitmask

    allowed = unpack_bitmask(mask, vocab)
    shifted = torch.roll(scores, shifts=step * 7919, dims=1)
    return shifted.masked_fill(~allowed, float("-inf")).argmax(dim=1).tolist()


def _replayed(rows, ids: list[int], recorded: list[list[int]], mask, vocab: int) -> list[int]:
    """The token each row had in the recorded run where the mask allows it (the tracker may
    have forced other text here than there: then the stand-in's choice)."""
    from sgdsl.runtime.layers.bitmask import unpack_bitmask

    allowed = unpack_bitmask(mask, vocab)
    out = []
    for i, (req, fallback) in enumerate(zip(rows, ids)):
        rec, n = recorded[int(req.rid[1:])], len(req.output_ids)
        out.append(rec[n] if n < len(rec) and bool(allowed[i, rec[n]]) else fallback)
    return out


def _time_plans(tracker) -> list:
    """Wrap ``tracker.plan`` to add up its calls: [seconds, calls], updated in place."""
    plan, plan_time = tracker.plan, [0.0, 0]

    def timed_plan(req, grammar):
        t0 = time.perf_counter()
        try:
            return plan(req, grammar)
        finally:
            plan_time[0] += time.perf_counter() - t0
            plan_time[1] += 1

    tracker.plan = timed_plan
    return plan_time


def run(a: argparse.Namespace) -> None:
    recorded = None
    if a.replay:
        recorded = json.loads(Path(a.replay).read_text())["output_ids"]
        a.batch = len(recorded)
    mgr, eos, vocab = _manager(a.model, a.backend, a.jump_forward)
    reqs, checker = _requests(mgr, a.batch, a.max_new, eos)
    if mgr.completion.jobs is not None:  # the estimate worker: up before timing, as in serving
        assert mgr.completion.jobs.worker.wait_ready(120), mgr.completion.jobs.worker.dead
    from sgdsl.runtime.scheduler.process import SWITCH_INTERVAL_S

    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as in the scheduler process

    gen = torch.Generator().manual_seed(a.seed)
    scores = torch.rand(a.batch, vocab, generator=gen, dtype=torch.float32)
    plan_time = _time_plans(mgr.completion)
    prof = cProfile.Profile() if a.profile else None
    rows = list(reqs)
    mask = mgr.fill_bitmask(rows)
    t_after = t_fill = t_late = 0.0
    steps = 0
    while rows:
        ids = _sample(scores[[int(r.rid[1:]) for r in rows]], mask, steps, vocab)
        if recorded is not None:
            ids = _replayed(rows, ids, recorded, mask, vocab)
        for req, token in zip(rows, ids):
            req.output_ids.append(token)
            req.finish_reason = checker.check(req)
        if prof:
            prof.enable()
        mask, times = _grammar_step(mgr, rows, checker, a.jump_forward)
        if prof:
            prof.disable()
        keep = [i for i, r in enumerate(rows) if not r.finished]
        rows, mask = [rows[i] for i in keep], (mask[keep] if mask is not None else None)
        t_after, t_fill, t_late = (x + y for x, y in zip((t_after, t_fill, t_late), times))
        steps += 1
    _report(a, reqs, steps, (t_after, t_fill, t_late), plan_time, mgr)
    mgr.shutdown()
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(a.profile)


def _grammar_step(mgr, rows: list, checker, jump_forward: bool):
    """One step's grammar work as the scheduler does it with overlap: the prefetch, then
    ``after_sample``, then ``fill_bitmask``, then ``plan_deferred`` (which the scheduler
    makes after the sampling launch). Returns the next bitmask and those three times."""
    from sgdsl.runtime.grammar.base import fill_bitmask_grouped

    prefetch = mgr.prefetch(rows)  # the next step's rows: the batch as launched
    t0 = time.perf_counter()
    jumped = mgr.after_sample(rows, checker, len(rows), prefetch)
    # jump-forward: the forced tokens are appended and accepted; the scheduler feeds them
    # next step, which changes nothing for the matchers (their rows are filled below)
    assert jump_forward or not jumped
    t1 = time.perf_counter()
    mask = mgr.fill_bitmask(rows, [r.finished for r in rows], prefetch)
    t2 = time.perf_counter()
    if jumped:  # their rows are open (the scheduler drops the token sampled from them and
        # fills them on the helper thread during the next read: not counted)
        at = {id(r): i for i, r in enumerate(rows)}
        fill_bitmask_grouped([r.grammar for r in jumped], mask, [at[id(r)] for r in jumped])
        t2 = time.perf_counter()
    measured, requeued = mgr.plan_deferred(checker)  # forced rows finish
    assert not requeued  # no logprobs here: a forced request finishes at once
    return mask, (t1 - t0, t2 - t1, time.perf_counter() - t2)


def _report(a, reqs, steps, times, plan_time, mgr) -> None:
    t_after, t_fill, t_late = times
    tokens = sum(len(r.output_ids) for r in reqs)
    tok = mgr.tokenizer
    valid = 0
    for r in reqs:
        try:
            json.loads(tok.decode([t for t in r.output_ids if t not in mgr.eos]))
            valid += 1
        except ValueError:
            pass
    stats, jobs = mgr.stats_dict(), mgr.completion.jobs
    print(f"batch {a.batch} | max_new {a.max_new} | steps {steps} | output tokens {tokens} | "
          f"parseable {valid}/{len(reqs)}")
    print(f"per step: after_sample {1e3 * t_after / steps:.2f} ms (tracker.plan "
          f"{1e3 * plan_time[0] / steps:.2f} ms, {plan_time[1] / steps:.1f} rows), "
          f"fill_bitmask {1e3 * t_fill / steps:.2f} ms, after the launch "
          f"{1e3 * t_late / steps:.2f} ms")
    print(f"searches {stats['grammar_completion_searches']}, shared "
          f"{stats['grammar_completion_shared']}, forced {stats['grammar_forced_completions']}, "
          f"in the estimate worker {jobs.submitted if jobs else 0} "
          f"({jobs.answered if jobs else 0} answers taken from it, "
          f"{jobs.searched_here if jobs else 0} searched here)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--backend", default="xgrammar")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jump-forward", action="store_true",
                    help="jump-forward on (as in serving); off: the mask-only path")
    ap.add_argument("--profile", type=int, default=0, help="print the top N functions")
    ap.add_argument("--replay", default=None, metavar="JSON",
                    help="sample the tokens of a GPU run instead (bench_structured_decode.py "
                         "--dump-outputs); --batch is then its request count")
    a = ap.parse_args()
    run(a)
    import os
    os._exit(0)  # compile workers and helper threads: no orderly teardown needed here


if __name__ == "__main__":
    main()

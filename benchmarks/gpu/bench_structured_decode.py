"""JSON-constrained decoding vs unconstrained on one GPU, in-process (issue 15, item 5).

One ``ModelRunner`` (Llama-3.1-8B config, dummy bf16 weights, CUDA graphs up to batch 256)
serves a fresh ``Scheduler`` per mode, so every mode runs on the same weights and graphs in one
process: ``unconstrained`` (ignore_eos), ``mask-only`` (xgrammar, jump-forward off) and
``jump-forward`` (xgrammar, jump-forward on), overlap scheduling on, at batch 1, 32 and 256.
256-token random prompts, max_new_tokens 96, greedy, a fixed 5-field person schema. The
unconstrained run gives each request the length it had under mask-only (``--no-match-lengths``:
all run to max_new), so both do the same work.

Per mode and batch: tokens/s from submission to the last finish (output tokens / wall) and
over the decode-only steps, the ratio to unconstrained, valid JSON outputs, and a per-step
breakdown (``--breakdown``): wall time inside the scheduler's hot functions per decode step.
``--compile`` adds compile time p50/p99 over tests/data/schemas/json (cold, one at a time).

    python benchmarks/gpu/bench_structured_decode.py --batches 1 32 256 --breakdown --compile
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_timeline  # noqa: E402
from common import device_line, model_dir, print_table, random_prompts  # noqa: E402
from http_clients import SCHEMA  # noqa: E402  (re-exported: other scripts import it here)
from host_profile import (TIMES, dump_outputs, gc_timer, instrument,  # noqa: E402
                          print_breakdown, profile_method)

EOS: list[int] = []  # the model config's eos_token_id (Llama-3.1: 128001, 128008, 128009)
SUITE = Path(__file__).resolve().parents[2] / "tests" / "data" / "schemas" / "json"

def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_runner(model: str, max_bs: int):
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.runner import ModelRunner

    config = EngineConfig(model=model_dir(model), load_format="dummy",
                          context_length=1024, max_running_requests=max_bs,
                          cuda_graph_max_bs=max_bs, chunked_prefill_size=8192,
                          grammar_backend="xgrammar")
    return config, ModelRunner(config)


# mode -> (jump-forward, forced-completion tracking): "-sync" keeps every completion
# estimate on the scheduler thread (no estimate worker), "-nocomplete" turns forced
# completion off (its cost)
MODES = {"unconstrained": (None, None), "mask-only": (False, "async"),
         "jump-forward": (True, "async"), "mask-only-sync": (False, "sync"),
         "mask-only-nocomplete": (False, None)}


def make_scheduler(runner, config, tokenizer, backend, mode: str,
                   jump_max_batch: int | None = None):
    from sgdsl.runtime.grammar.forcing.completion import CompletionConfig
    from sgdsl.runtime.grammar.manager import GrammarManager
    from sgdsl.runtime.scheduler.scheduler import Scheduler

    jump, tracking = MODES[mode]
    completion = None if tracking is None else CompletionConfig(
        async_estimates=tracking == "async")
    grammar = None if jump is None else GrammarManager(
        backend, tokenizer, int(runner.model_config.vocab_size), EOS, jump_forward=jump,
        jump_max_batch=jump_max_batch, completion=completion)
    if grammar is not None:  # a serving engine's compile workers are up and the schema is
        # cached after its first request: compile it once before the clock starts (the cold
        # compile is measured by --compile)
        from sgdsl.runtime.grammar import GrammarKey

        grammar.compile.compiler.compile(GrammarKey.from_constraint("json_schema", json.dumps(SCHEMA)))
        jobs = grammar.forcing.completion.jobs if grammar.forcing.completion else None
        if jobs is not None:  # the completion-estimate worker, likewise up in a serving engine
            assert jobs.worker.wait_ready(120), jobs.worker.dead
    return Scheduler(runner, config, EOS, None, lambda msg: None, grammar=grammar)


def run_mode(sched, prompts: list[list[int]], constrained: bool, max_new: int,
             lengths: list[int] | None = None) -> dict:
    """Submit all prompts at once and step to the end; wall times and the finished Reqs.
    ``lengths``: per-request output lengths for an unconstrained run (ignore_eos), so that it
    does the same work as the constrained run it is compared with."""
    from sgdsl.runtime.ipc import messages as m
    from sgdsl.runtime.sampling_params import SamplingParams

    finished: dict[str, dict] = {}

    def collect(msg) -> None:
        for o in getattr(msg, "outs", []):
            rec = finished.setdefault(o.rid, {"output_ids": [], "finish": None})
            rec["output_ids"] += o.new_ids
            rec["finish"] = o.finish_reason

    orig_send = sched.send
    sched.send = collect
    kw = dict(max_new_tokens=max_new, temperature=0.0)
    params = (SamplingParams(json_schema=json.dumps(SCHEMA), **kw) if constrained
              else SamplingParams(ignore_eos=True, **kw))
    TIMES.clear()
    sync()
    t0 = time.perf_counter()
    for i, ids in enumerate(prompts):
        p = params if lengths is None else SamplingParams(
            ignore_eos=True, temperature=0.0, max_new_tokens=max(1, lengths[i]))
        sched.handle(m.TokenizedGenerateReq(f"r{i}", ids, p))
    t_dec, n_dec, steps = 0.0, 0, 0
    while True:
        decoding = not sched.waiting and sched.chunked is None and not (
            sched.grammar and sched.grammar.pending)
        t1 = time.perf_counter()
        if not sched.step():
            break
        if decoding:
            t_dec += time.perf_counter() - t1
            n_dec += 1
        steps += 1
    sync()
    wall = time.perf_counter() - t0
    sched.send = orig_send
    prof = {k: tuple(v) for k, v in TIMES.items()}
    return {"wall": wall, "t_dec": t_dec, "n_dec": n_dec, "steps": steps,
            "outs": list(finished.values()), "by_rid": finished,
            "prof": prof}


def summarize(res: dict, tokenizer) -> dict:
    outs = res["outs"]
    tokens = sum(len(o["output_ids"]) for o in outs)
    valid = 0
    for o in outs:
        try:
            obj = json.loads(tokenizer.decode(o["output_ids"], skip_special_tokens=True))
            valid += isinstance(obj, dict) and set(obj) == set(SCHEMA["properties"])
        except ValueError:
            pass
    reasons: dict[str, int] = defaultdict(int)
    for o in outs:
        reasons[(o["finish"] or {}).get("type", "none")] += 1
        if (o["finish"] or {}).get("type") == "abort":
            print("aborted:", o["finish"], tokenizer.decode(o["output_ids"])[:200])
    print("finish reasons:", dict(reasons))
    return {"tokens": tokens, "tok_s": tokens / res["wall"], "valid": valid, "n": len(outs),
            "dec_ms": 1e3 * res["t_dec"] / max(res["n_dec"], 1), "steps": res["steps"]}


def compile_times(tokenizer, vocab: int) -> list[float]:
    """Cold compile time of each suite schema through the backend (no cache)."""
    from sgdsl.runtime.errors import InvalidRequestError
    from sgdsl.runtime.grammar import GrammarKey, create_grammar_backend

    backend = create_grammar_backend("xgrammar", tokenizer, vocab, EOS)
    times, rejected = [], 0
    for path in sorted(SUITE.glob("*.json")):
        key = GrammarKey.from_constraint("json_schema", path.read_text())
        t0 = time.perf_counter()
        try:
            backend.compile(key)
        except InvalidRequestError:
            rejected += 1
            continue
        times.append(time.perf_counter() - t0)
    print(f"compile suite: {len(times)} compiled, {rejected} rejected")
    return sorted(times)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--modes", nargs="+", default=["unconstrained", "mask-only", "jump-forward"],
                    choices=list(MODES))
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--profile-plan", type=int, default=0, metavar="N",
                    help="cProfile the completion tracker's plan() in timed runs: top N")
    ap.add_argument("--profile-mixed", type=int, default=0, metavar="N",
                    help="cProfile the mixed steps' batch builder (jump-forward): top N")
    ap.add_argument("--dump-outputs", default=None, metavar="DIR",
                    help="write each constrained run's output ids to DIR (replayed on the CPU "
                         "by benchmarks/bench_grammar_host.py --replay)")
    ap.add_argument("--jump-max-batch", type=int, default=None,
                    help="the GrammarManager's jump_max_batch (jump-forward above it is off; "
                         "default: no limit)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds per batch size (modes interleaved); medians printed at the end")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--warmup-tokens", type=int, default=16,
                    help="max_new_tokens of each mode's warm-up run")
    ap.add_argument("--timeline", action="store_true",
                    help="per-step device/host timeline (step_timeline.py)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval seconds (default: the scheduler process's)")
    ap.add_argument("--no-match-lengths", dest="match_lengths", action="store_false",
                    help="unconstrained requests run to max_new (ignore_eos) instead of the "
                         "lengths the mask-only run produced")
    return ap.parse_args()


def measure_mode(a: argparse.Namespace, sched, prompts: list[list[int]], bs: int, mode: str,
                 lengths: list[int] | None) -> dict:
    """One mode at one batch size: a warm-up run, then the timed run (with the profiles and
    dumps asked for); the scheduler is shut down after."""
    constrained = mode != "unconstrained"
    # warm-up at the measured batch size: grammar compile, the mask kernel's
    # specializations (Triton specializes on the row count), allocator sizes
    # (16 tokens: jump-forward's first extends with a cached prefix JIT-compile too)
    run_mode(sched, prompts, constrained, a.warmup_tokens)
    sched.memory.flush()
    if a.timeline:
        step_timeline.start()
    # cProfiles asked for: the completion tracker's plan, the mixed-step batch builder
    targets = [(sched.grammar.forcing.completion if sched.grammar else None, "plan", a.profile_plan),
               (sched.running, "mixed_batch", a.profile_mixed)]
    profs = [(obj, attr, n, profile_method(obj, attr)) for obj, attr, n in targets
             if n and constrained and obj is not None]
    res = run_mode(sched, prompts, constrained, a.max_new, None if constrained else lengths)
    for obj, attr, n, prof in profs:
        import pstats

        delattr(obj, attr)  # the class's own again
        pstats.Stats(prof).sort_stats("tottime").print_stats(n)
    if a.timeline:
        tl = step_timeline.stop()
        print(f"timeline bs={bs} {mode}: " + ", ".join(
            f"{k} {v:.3f}" for k, v in tl.items()), flush=True)
    if a.dump_outputs and constrained:
        dump_outputs(a.dump_outputs, bs, mode, res, SCHEMA)
    # NOTE: the KV pool is the runner's and outlives this scheduler: its radix cache
    # must give the slots back, or the next mode runs on a smaller pool (the
    # unconstrained run, last, then retracted and re-prefilled: 35 extends, not 8)
    sched.memory.flush()
    if sched.grammar:
        jobs = sched.grammar.forcing.completion.jobs if sched.grammar.forcing.completion else None
        if jobs is not None:
            print(f"estimates in the worker: {jobs.submitted} sent, {jobs.answered} "
                  f"answers taken from it, {jobs.searched_here} searched here", flush=True)
        sched.grammar.shutdown()
    return res


def table_row(bs: int, mode: str, res: dict, s: dict, base: dict) -> list:
    return [bs, mode, s["tokens"], f"{res['wall']:.2f}", f"{s['tok_s']:.0f}",
            f"{s['tok_s'] / base['tok_s']:.2f}x", s["steps"], f"{s['dec_ms']:.2f}",
            f"{base['dec_ms'] / s['dec_ms']:.2f}x",
            f"{s['valid']}/{s['n']}" if mode != "unconstrained" else "-"]


def prepare_host(a: argparse.Namespace) -> None:
    """Probes asked for, then the process set up as the engine's scheduler process is."""
    if a.timeline:
        step_timeline.install()
    if a.breakdown:
        instrument()
        gc.callbacks.append(gc_timer)
    # as the engine does after startup (scheduler/process.py): full collections then scan only
    # what the run allocates, not the model, tokenizer and grammar state built before
    gc.collect()
    gc.freeze()
    from sgdsl.runtime.scheduler.process import SWITCH_INTERVAL_S  # and its switch interval

    sys.setswitchinterval(a.switch_interval if a.switch_interval else SWITCH_INTERVAL_S)
    print(f"switch interval {sys.getswitchinterval() * 1e3:g} ms")


def run_round(a: argparse.Namespace, runner, config, tok, backend, prompts: list[list[int]],
              bs: int, modes: list[str]) -> dict:
    """Every mode once at one batch size: mode -> (run, summary)."""
    summaries, lengths = {}, None
    for mode in modes:
        sched = make_scheduler(runner, config, tok, backend, mode, a.jump_max_batch)
        res = measure_mode(a, sched, prompts, bs, mode, lengths)
        if mode == "mask-only" and a.match_lengths:
            lengths = [len(res["by_rid"][f"r{i}"]["output_ids"]) for i in range(bs)]
        summaries[mode] = (res, summarize(res, tok))
        print(mode, bs, summaries[mode][1], flush=True)
        if a.breakdown and bs >= 32:
            print_breakdown(f"bs={bs} {mode}", res)
    return summaries


def main() -> None:
    a = parse_args()
    from transformers import AutoTokenizer

    from sgdsl.runtime.grammar import create_grammar_backend

    print(device_line())
    tok = AutoTokenizer.from_pretrained(model_dir(a.model))
    eos = json.loads(Path(model_dir(a.model), "config.json").read_text())["eos_token_id"]
    EOS.extend(eos if isinstance(eos, list) else [eos])
    config, runner = build_runner(a.model, max(a.batches))
    vocab = int(runner.model_config.vocab_size)
    backend = create_grammar_backend("xgrammar", tok, vocab, EOS)
    prepare_host(a)
    rows = []
    # NOTE: with --match-lengths the unconstrained run comes last and gives every request the
    # output length it had under mask-only (ignore_eos): constrained requests stop at their
    # value's end (~57 tokens here) while free ones would run to max_new, and fewer tokens over
    # the same prefill is a lower tokens/s that says nothing about decoding speed.
    modes = list(a.modes)
    if a.match_lengths and "unconstrained" in modes and "mask-only" in modes:
        modes = [m for m in modes if m != "unconstrained"] + ["unconstrained"]
    ratios: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for bs in a.batches:
        prompts = random_prompts(bs, a.prompt_len, seed=bs, vocab=min(vocab, 120000))
        for _ in range(a.repeat):  # NOTE: rounds interleave the modes (the host drifts)
            summaries = run_round(a, runner, config, tok, backend, prompts, bs, modes)
            base = summaries.get("unconstrained", next(iter(summaries.values())))
            for mode in a.modes:
                rows.append(table_row(bs, mode, *summaries[mode], base[1]))
                ratios[bs, mode].append((summaries[mode][1]["tok_s"] / base[1]["tok_s"],
                                         base[0]["wall"] / summaries[mode][0]["wall"]))
                print(rows[-1], flush=True)
    print_table("structured decode (Llama-3.1-8B dummy, xgrammar, graphs + overlap)",
                ["batch", "mode", "out tokens", "wall s", "tok/s", "vs unconstr.", "steps",
                 "ms/decode step", "step vs unconstr.", "valid JSON"], rows)
    if a.repeat > 1:
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        print_table(f"medians over {a.repeat} rounds (vs unconstrained in the same round)",
                    ["batch", "mode", "tok/s ratio", "speed (unconstr. wall / wall)", "all"],
                    [[bs, mode, f"{med([r for r, _ in v]):.2f}x", f"{med([w for _, w in v]):.2f}x",
                      " ".join(f"{r:.2f}/{w:.2f}" for r, w in v)]
                     for (bs, mode), v in ratios.items()])
    if a.compile:
        t = compile_times(tok, vocab)
        p = lambda q: 1e3 * t[min(len(t) - 1, int(q * len(t)))]  # noqa: E731
        print(f"compile p50 {p(0.5):.1f} ms, p99 {p(0.99):.1f} ms, max {1e3 * t[-1]:.1f} ms "
              f"over {len(t)} schemas")


if __name__ == "__main__":
    main()

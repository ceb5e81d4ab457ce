"""Speculative decoding with real acceptance (issue 25, rows b-d): the embedded
SmolLM2-135M-Instruct (its GGUF file, dequantized once by the runtime's loader), greedy, batch 1
with CUDA graphs on the GPU, every row against the non-speculative engine in the same run.
``bench_speculative.py`` is the same at Llama-3.1-8B's shapes with dummy weights, whose outputs
never repeat their prompt (NGRAM accepted nothing there).

Rows (one Engine per side, one after the other, so each has the device to itself):
  (b) NGRAM on copy-heavy chat prompts (code editing, "repeat this text": the answer repeats
      the prompt), batch 1, each prompt to its EOS or ``--out-len``;
  (c) batch ``--batch`` of those prompts (each made distinct), NGRAM vs off (speculation backs
      off above ``speculative_max_batch_size``, target >= 0.97x);
  (d) JSON-schema-constrained batch 1 (xgrammar), NGRAM vs off;
  (s) STANDALONE, the model drafting for itself (the draft model path is the model's own
      directory), batch 1 on the copy prompts (the CPU tests' acceptance: > 2 tokens per step).
Batch-1 decode tok/s = sum(n - 1) / sum(t(n tokens) - t(1 token)) over the prompts (both
runs after a first one put the prompt in the radix cache), so prefill and request overhead
cancel; tokens per verify step =
completion_tokens / spec_verify_ct (meta_info). NOTE: as SGLang's, ``spec_verify_ct`` counts a
speculative engine's plain decode steps too (no draft, backoff, batch too large), and the
completion tokens include jump-forward tokens: with a grammar it is tokens per decode step.
Each row also prints the engine counters it moved (``spec_*`` deltas): verify steps, plain
steps after an empty proposal, tokens per verified row, verifies replayed on CUDA graphs. Greedy outputs of each side are compared with
the plain engine's token for token (the count of equal outputs is printed).

    python benchmarks/gpu/bench_speculative_real.py --model-path /tmp/x/SmolLM2-135M-Instruct.Q4_1.gguf
    python benchmarks/gpu/bench_speculative_real.py --device cpu --out-len 48 --batch 8 \\
        --batch-out-len 16 --json-out-len 48 --prompts 2 --num-threads 2
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import time

from common import print_table
from spec_real_prompts import COPY_PROMPTS, JSON_PROMPTS, PERSON_SCHEMA

LABELS = {"b": "(b) NGRAM copy-heavy, batch 1", "c": "(c) NGRAM batch {batch}",
          "d": "(d) NGRAM JSON schema, batch 1", "s": "(s) STANDALONE self-draft, batch 1"}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", default=None,
                    help="GGUF file or HF directory (default: the embedded model)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rows", default="b,c,d,s")
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=len(COPY_PROMPTS))
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-out-len", type=int, default=128)
    ap.add_argument("--json-out-len", type=int, default=96)
    ap.add_argument("--context-length", type=int, default=2048)
    ap.add_argument("--max-total-tokens", type=int, default=None,
                    help="KV slots (default: 131072 on cuda, the byte budget on cpu)")
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--disable-cuda-graph", action="store_true")
    ap.add_argument("--min-speedup", type=float, default=None,
                    help="speculative_min_speedup of the speculative engines (default: the "
                         "engine's, 1.0: the cost gate on; 0: off)")
    return ap.parse_args()


def open_engine(side: str, a: argparse.Namespace, model_dir: str, grammar: bool):
    from sgdsl.runtime import Engine

    kw = dict(model=model_dir, device=a.device, dtype=a.dtype, max_running_requests=a.batch,
              context_length=a.context_length, num_threads=a.num_threads,
              disable_cuda_graph=a.disable_cuda_graph,
              grammar_backend="xgrammar" if grammar else "none", grammar_compile_workers=1)
    total = a.max_total_tokens or (131072 if a.device == "cuda" else None)
    if total:
        kw["max_total_tokens"] = total
    if side != "plain" and a.min_speedup is not None:
        kw["speculative_min_speedup"] = a.min_speedup
    if side == "ngram":
        kw.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=a.draft_tokens)
    elif side == "standalone":
        kw.update(speculative_algorithm="STANDALONE", speculative_draft_model_path=model_dir,
                  speculative_num_draft_tokens=a.draft_tokens)
    return Engine(**kw)


def greedy(n: int, **extra) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, **extra}


def batch1(engine, prompts: list[str], out_len: int, **extra) -> dict:
    """Each prompt alone, to its EOS or ``out_len``: decode tok/s, tokens per verify step,
    the outputs' ids and per-prompt details."""
    engine.generate(prompts, [greedy(min(out_len, 16), **extra)] * len(prompts))  # warm-up
    spent, cpu, tokens, steps, outs, detail = 0.0, 0.0, 0, 0, [], []
    for prompt in prompts:
        times, cpus = {}, {}
        engine.flush_cache()
        engine.generate(prompt, greedy(1, **extra))  # the prompt's KV into the radix cache
        for n in (1, out_len):  # both runs hit it: prefill noise (CPU) does not enter the diff
            before = spec_counters(engine)
            t0, c0 = time.perf_counter(), cpu_seconds()
            out = engine.generate(prompt, greedy(n, **extra))
            times[n] = time.perf_counter() - t0
            cpus[n] = cpu_seconds() - c0
        verifies = spec_counters(engine).get("spec_verify_steps", 0) - before.get(
            "spec_verify_steps", 0)  # of the out_len run
        meta, n_out = out["meta_info"], len(out["output_ids"])
        spent += times[out_len] - times[1]
        cpu += cpus[out_len] - cpus[1]
        tokens += n_out - 1
        steps += meta.get("spec_verify_ct") or 0
        outs.append(out["output_ids"])
        detail.append((n_out, 1e3 * (times[out_len] - times[1]) / max(1, n_out - 1),
                       n_out / meta["spec_verify_ct"] if meta.get("spec_verify_ct") else None,
                       1e3 * (times[out_len] - times[1]), verifies,
                       meta.get("spec_verify_ct") or n_out - 1))
    per_step = sum(len(o) for o in outs) / steps if steps else None
    # NOTE: on a shared CPU box the wall time carries the other jobs' load (+-30%), the CPU
    # time of the engine's processes much less of it
    return {"tok_s": tokens / spent, "cpu_tok_s": tokens / cpu if cpu > 0 else None,
            "per_step": per_step, "outs": outs, "detail": detail}


def cpu_seconds() -> float:
    """CPU time of this process and its children (the scheduler runs in a spawned one); 0
    without psutil (its ratio column then reads "-")."""
    try:
        import psutil
    except ImportError:
        return 0.0
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a child that just exited
            pass
    return total


def batched(engine, prompts: list[str], out_len: int) -> dict:
    """Output tokens per second of the whole batch submitted at once (warm-up batch first)."""
    engine.generate(prompts[:8], [greedy(min(out_len, 16))] * min(8, len(prompts)))
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, [greedy(out_len)] * len(prompts))
    wall = time.perf_counter() - t0
    ids = [o["output_ids"] for o in outs]
    return {"tok_s": sum(map(len, ids)) / wall, "per_step": None, "outs": ids, "detail": []}


def run_side(side: str, a: argparse.Namespace, model_dir: str, work: dict) -> dict:
    """Every requested row's measurement on one engine (``side``: plain, ngram, standalone)."""
    rows = set(a.rows.split(","))
    rows = {"plain": rows, "ngram": rows - {"s"}, "standalone": rows & {"s"}}[side]
    grammar = "d" in rows and importlib.util.find_spec("xgrammar") is not None
    res: dict = {}
    t0 = time.perf_counter()
    with open_engine(side, a, model_dir, grammar) as engine:
        print(f"[{side}] engine up in {time.perf_counter() - t0:.1f} s", flush=True)
        jobs = {"b": lambda: batch1(engine, work["copy"], a.out_len),
                "c": lambda: batched(engine, work["batch"], a.batch_out_len),
                "d": lambda: batch1(engine, work["json"], a.json_out_len,
                                    json_schema=json.dumps(PERSON_SCHEMA))}
        for row in [r for r in "bcd" if r in rows or (r == "b" and "s" in rows)]:
            if row == "d" and not grammar:
                continue
            before = spec_counters(engine)
            res[row] = jobs[row]()
            if before:
                print(f"[{side}] row {row}: {counter_line(before, spec_counters(engine))}"
                      f"{gate_line(engine.stats())}", flush=True)
        engine.check_idle_integrity()
        stats = spec_counters(engine)
        gate = engine.stats()  # the cost gate's last look; its mean intervals in ms
        rates = {k: round(gate[k], 2) for k in (
            "spec_cost_spec_rate", "spec_cost_plain_rate", "spec_cost_ratio",
            "spec_cost_ceiling_rate", "spec_cost_prior_ceiling") if k in gate}
        rates.update({f"{k}_ms": round(1e3 * gate[k], 3) for k in (
            "spec_cost_first_interval", "spec_cost_steady_interval") if k in gate})
    print(f"[{side}] done at {time.perf_counter() - t0:.1f} s; {stats} {rates}", flush=True)
    if side == "standalone" and "b" in res:
        res["s"] = res.pop("b")
    return res


def spec_counters(engine) -> dict:
    """The engine's ``spec_*`` counters (empty for a non-speculative engine)."""
    return {k: v for k, v in engine.stats().items() if k.startswith("spec_")
            and isinstance(v, int)}


def counter_line(before: dict, after: dict) -> str:
    """What one row moved: verify steps (of them replayed on the verify / decode graphs), plain
    steps after an empty proposal (read synchronously), predicted empty (overlapped) or decided
    up front (of them by the cost gate), tokens per verified request row."""
    d = {k: after[k] - before.get(k, 0) for k in after}
    rows = d["spec_verify_rows"]
    per_row = f"{d['spec_emitted_tokens'] / rows:.2f}" if rows else "-"
    return (f"verify steps {d['spec_verify_steps']} (tree {d['spec_tree_steps']}; graphs: "
            f"verify {d['spec_verify_graph_steps']}, decode "
            f"{d.get('spec_verify_decode_graph_steps', 0)}), empty proposals "
            f"{d['spec_empty_proposals']}, predicted empty {d.get('spec_predicted_empty', 0)}, "
            f"skipped {d['spec_skipped_steps']} (cost gate {d.get('spec_cost_off_steps', 0)}, "
            f"losses {d.get('spec_cost_losses', 0)} (hopeless {d.get('spec_cost_hopeless', 0)}), "
            f"first intervals dropped "
            f"{d.get('spec_cost_first_dropped', 0)}), drafted "
            f"{d['spec_draft_tokens']}, accepted {d['spec_accepted_tokens']}, tokens per "
            f"verified row {per_row}, draft graph steps {d['spec_draft_graph_steps']}, grammar: "
            f"step ends {d.get('spec_grammar_step_ends', 0)}, forced between drafts "
            f"{d.get('spec_forced_between_drafts', 0)}")


def gate_line(stats: dict) -> str:
    """The cost gate's last decision as the row ends (not a delta: the engine's rows share
    it): a speculative step's cost over a plain one's, and the accepted tokens per verify a
    request needs at that ratio."""
    ratio = stats.get("spec_cost_ratio")
    if not ratio:
        return ""
    return (f"; gate: last step-cost ratio {ratio:.2f} (needs {ratio - 1:.2f} accepted per "
            f"verify), steady spec interval {1e3 * stats['spec_cost_steady_interval']:.3f} ms")


def equal_count(want: list[list[int]], got: list[list[int]]) -> tuple[int, list[int]]:
    """(outputs equal token for token, the first differing position of each unequal one)."""
    diverge = [next((i for i, (x, y) in enumerate(zip(w, g)) if x != y), min(len(w), len(g)))
               for w, g in zip(want, got) if w != g]
    return len(want) - len(diverge), diverge


def step_costs(row: str, base: list, got: list) -> None:
    """A speculative (verify) step's cost against a plain step's, batch 1: the plain engine's
    ms per token is its step; the speculative engine's decode time less its plain steps (at
    the plain engine's cost on the same prompt) over its verify steps (each prompt's decode
    time: the out_len run less the 1-token one, which has no decode step)."""
    plain_ms = sum(b[3] for b in base) / max(1, sum(b[5] for b in base))
    verify_s = sum(g[4] for g in got)
    if not verify_s:
        return
    rest = sum(g[3] - (g[5] - g[4]) * b[1] for b, g in zip(base, got))
    print(f"  {row} step costs: plain step {plain_ms:.3f} ms, speculative (verify) step "
          f"{rest / verify_s:.3f} ms ({rest / verify_s / plain_ms:.2f} plain steps; {verify_s} "
          f"verify steps, {sum(g[5] - g[4] for g in got)} plain steps of the spec engine)",
          flush=True)


def report(a: argparse.Namespace, plain: dict, spec: dict) -> None:
    table = []
    for row in [r for r in "bcds" if r in spec or r in a.rows.split(",")]:
        base, got = plain.get("b" if row == "s" else row), spec.get(row)
        label = LABELS[row].format(batch=a.batch)
        if base is None or got is None:
            table.append([label, "skipped (no xgrammar)" if row == "d" else "not run",
                          "", "", "", "", ""])
            continue
        equal, diverge = equal_count(base["outs"], got["outs"])
        by_cpu = got.get("cpu_tok_s") and base.get("cpu_tok_s")
        table.append([label, base["tok_s"], got["tok_s"], got["tok_s"] / base["tok_s"],
                      got["cpu_tok_s"] / base["cpu_tok_s"] if by_cpu else "-",
                      got["per_step"] or "-", f"{equal}/{len(base['outs'])}"
                      + (f" (first diff at {diverge})" if diverge else "")])
        for i, (b, g) in enumerate(zip(base["detail"], got["detail"])):
            (n, ms_b, _), (_, ms_g, per) = b[:3], g[:3]
            print(f"  {row} prompt {i}: {n} tokens, plain {ms_b:.2f} ms/token, spec "
                  f"{ms_g:.2f} ms/token ({ms_b / ms_g:.2f}x), tokens/verify "
                  f"{per if per is None else round(per, 2)}")
        step_costs(row, base["detail"], got["detail"])
    print_table(f"speculative decoding with real acceptance, SmolLM2-135M-Instruct "
                f"({a.device}, dtype {a.dtype}, {a.draft_tokens} draft tokens, graphs "
                f"{'off' if a.disable_cuda_graph or a.device == 'cpu' else 'on'})",
                ["row", "plain tok/s", "spec tok/s", "ratio", "ratio by CPU time",
                 "tokens/verify", "greedy-equal outputs"], table)


def main() -> None:
    a = parse_args()
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.loader import resolve_model_dir

    t0 = time.perf_counter()
    model_dir = str(resolve_model_dir(EngineConfig(model=a.model_path)))  # GGUF: converted once
    print(f"model dir {model_dir} ({time.perf_counter() - t0:.1f} s)", flush=True)
    copy = COPY_PROMPTS[:a.prompts]
    work = {"copy": copy, "json": JSON_PROMPTS,
            "batch": [f"({i}) " + copy[i % len(copy)] for i in range(a.batch)]}
    plain = run_side("plain", a, model_dir, work)
    spec = run_side("ngram", a, model_dir, work) if set(a.rows.split(",")) - {"s"} else {}
    if "s" in a.rows.split(","):
        spec.update(run_side("standalone", a, model_dir, work))
    report(a, plain, spec)


if __name__ == "__main__":
    main()

"""Pipeline parallelism (issue 30 item 5): Llama-3.1-70B (dummy bf16 weights, same seed in every
layout) on 4 GPUs at TP=4 vs PP=2 x TP=2 (micro-batches in flight, and whole batches), in one
run, through the Engine (one process per rank, NCCL, CUDA graphs per stage, overlap on), greedy:
- batch-1 decode tok/s = (out - 1) / (t(out tokens) - t(1 token)) (prefill cancels);
- offline: ``--num`` prompts of ``--in-len`` random tokens, ``--out-len`` out each, all at
  once: output tok/s and total (in + out) tok/s (a batch of ``--num``).
Ratios are printed against TP=4. The first 32 greedy tokens of one prompt are compared with
TP=4's (the same dummy model: every rank draws the same seeded stream; bf16 all-reduces over 2
vs 4 ranks round differently, so a late split is legitimate, an early one is a bug).

Needs 4 GPUs (the device tool's nvidia-h100-x4 kind); from the repository root:
  source benchmarks/gpu/device_env.sh && python benchmarks/gpu/bench_pp.py
(each layout loads the 70B once, ~1-2 min; ``--layouts tp4,pp2-tp2`` to split the run.)
"""
from __future__ import annotations

import argparse
import time

import torch

from common import model_dir, print_table, random_prompts, time_decode

MODEL = "llama-3.1-70b"
LAYOUTS = {"tp4": dict(tp_size=4), "pp2-tp2": dict(pp_size=2, tp_size=2),
           "pp2-tp2-whole": dict(pp_size=2, tp_size=2, pp_micro_batches=1),
           "pp4": dict(pp_size=4)}


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}


def measure(layout: str, a: argparse.Namespace) -> dict:
    from sgdsl.runtime import Engine

    kw = dict(LAYOUTS[layout], disable_cuda_graph=a.disable_cuda_graph)
    one = random_prompts(1, a.prompt_len, seed=0)[0]
    prompts = random_prompts(a.num, a.in_len, seed=1)
    t0 = time.perf_counter()
    with Engine(model=model_dir(MODEL), load_format="dummy", max_running_requests=a.num,
                cuda_graph_max_bs=min(a.num, 256), context_length=4096,
                chunked_prefill_size=8192, grammar_backend="none", **kw) as engine:
        start_s = time.perf_counter() - t0
        tokens = engine.generate(input_ids=one, sampling_params=greedy(32))["output_ids"]
        batch1 = 1 / time_decode(engine, one, a.decode_len)[1]
        engine.generate(input_ids=prompts[:8], sampling_params=greedy(8))  # warm-up
        engine.flush_cache()
        t0 = time.perf_counter()
        res = engine.generate(input_ids=prompts, sampling_params=greedy(a.out_len))
        wall = time.perf_counter() - t0
    out = sum(len(r["output_ids"]) for r in res)
    assert out == a.num * a.out_len
    return {"start_s": start_s, "batch1": batch1, "out_tok_s": out / wall,
            "total_tok_s": (out + a.num * a.in_len) / wall, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", default="tp4,pp2-tp2,pp2-tp2-whole")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--num", type=int, default=64)
    ap.add_argument("--in-len", type=int, default=1024)
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--disable-cuda-graph", action="store_true")
    a = ap.parse_args()
    assert torch.cuda.device_count() >= 4, "needs 4 GPUs"
    results, rows = {}, []
    for layout in a.layouts.split(","):
        r = results[layout] = measure(layout, a)
        base = results.get("tp4", r)
        same = next((i for i, (x, y) in enumerate(zip(r["tokens"], base["tokens"])) if x != y),
                    len(r["tokens"]))
        rows.append([f"{MODEL} {layout}", r["batch1"], r["batch1"] / base["batch1"],
                     r["out_tok_s"], r["total_tok_s"], r["total_tok_s"] / base["total_tok_s"],
                     f"{same}/32", r["start_s"]])
        print(rows[-1], flush=True)
    print_table(f"Pipeline parallelism, dummy bf16, {a.num} x {a.in_len} in / {a.out_len} out "
                f"offline, batch-1 decode of {a.decode_len}"
                + (" (no CUDA graphs)" if a.disable_cuda_graph else ""),
                ["run", "batch-1 tok/s", "vs tp4", f"batch-{a.num} out tok/s",
                 "offline total tok/s", "vs tp4", "greedy = tp4", "start s"], rows)


if __name__ == "__main__":
    main()

"""Expert parallelism (issue 30 item 4): Qwen3-30B-A3B (128 experts, top-8; dummy bf16 weights)
on 4 GPUs at TP=4 vs EP=4 (all-to-all dispatch) vs EP=4 in the all_reduce mode, in one run,
through the Engine (one process per rank, NCCL, CUDA graphs, overlap on), greedy:
- batch-1 decode tok/s = (out - 1) / (t(out tokens) - t(1 token)) (prefill cancels);
- offline: ``--num`` prompts of ``--in-len`` random tokens, ``--out-len`` out each, all at
  once: output tok/s and total (in + out) tok/s.
Ratios are printed against TP=4. The first 32 greedy tokens of one prompt are compared with
TP=4's (same dummy model; bf16 rounding may legitimately split them late).

Needs 4 GPUs (the device tool's nvidia-h100-x4 kind); from the repository root:
  source benchmarks/gpu/device_env.sh && python benchmarks/gpu/bench_ep.py
"""
from __future__ import annotations

import argparse
import time

import torch

from common import model_dir, print_table, random_prompts, time_decode

MODEL = "qwen3-30b-a3b"
LAYOUTS = {"tp4": dict(tp_size=4), "ep4": dict(tp_size=4, ep_size=4),
           "ep4-allreduce": dict(tp_size=4, ep_size=4, ep_dispatch="all_reduce"),
           "tp4-ep2": dict(tp_size=4, ep_size=2)}


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}


def measure(layout: str, a: argparse.Namespace) -> dict:
    from sgdsl.runtime import Engine

    kw = dict(LAYOUTS[layout], disable_cuda_graph=a.disable_cuda_graph)
    one = random_prompts(1, a.prompt_len, seed=0)[0]
    prompts = random_prompts(a.num, a.in_len, seed=1)
    t0 = time.perf_counter()
    with Engine(model=model_dir(MODEL), load_format="dummy", max_running_requests=a.num,
                cuda_graph_max_bs=a.num, context_length=4096, chunked_prefill_size=8192,
                grammar_backend="none", **kw) as engine:
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
    ap.add_argument("--layouts", default="tp4,ep4,ep4-allreduce")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--in-len", type=int, default=512)
    ap.add_argument("--out-len", type=int, default=256)
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
    print_table(f"Expert parallelism, dummy bf16, {a.num} x {a.in_len} in / {a.out_len} out "
                f"offline, batch-1 decode of {a.decode_len}"
                + (" (no CUDA graphs)" if a.disable_cuda_graph else ""),
                ["run", "batch-1 tok/s", "vs tp4", "offline out tok/s", "offline total tok/s",
                 "vs tp4", "greedy = tp4", "start s"], rows)


if __name__ == "__main__":
    main()

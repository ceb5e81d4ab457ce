"""Parallel layouts of one model against TP=4 (bench_ep.py, bench_pp.py): for each layout an
Engine on 4 GPUs (dummy bf16, same seed), its first 32 greedy tokens compared with tp4's, batch-1
decode tok/s and an offline batch's throughput, printed as one table with the ratios to tp4."""
from __future__ import annotations

import argparse
import time

import torch

from common import model_dir, print_table, random_prompts, time_decode


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}


def add_args(ap: argparse.ArgumentParser, layouts: str, num: int, in_len: int,
             out_len: int) -> None:
    ap.add_argument("--layouts", default=layouts)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--num", type=int, default=num)
    ap.add_argument("--in-len", type=int, default=in_len)
    ap.add_argument("--out-len", type=int, default=out_len)
    ap.add_argument("--disable-cuda-graph", action="store_true")


def measure(model: str, kw: dict, a: argparse.Namespace, graph_bs: int) -> dict:
    from sgdsl.runtime import Engine

    one = random_prompts(1, a.prompt_len, seed=0)[0]
    prompts = random_prompts(a.num, a.in_len, seed=1)
    t0 = time.perf_counter()
    with Engine(model=model_dir(model), load_format="dummy", max_running_requests=a.num,
                cuda_graph_max_bs=graph_bs, context_length=4096, chunked_prefill_size=8192,
                grammar_backend="none", disable_cuda_graph=a.disable_cuda_graph, **kw) as engine:
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


def compare(model: str, layouts: dict[str, dict], a: argparse.Namespace, title: str,
            graph_bs: int) -> None:
    """Measure ``a.layouts`` (names of ``layouts``) in order; tp4 is the reference."""
    assert torch.cuda.device_count() >= 4, "needs 4 GPUs"
    results, rows = {}, []
    for layout in a.layouts.split(","):
        r = results[layout] = measure(model, layouts[layout], a, graph_bs)
        base = results.get("tp4", r)
        same = next((i for i, (x, y) in enumerate(zip(r["tokens"], base["tokens"])) if x != y),
                    len(r["tokens"]))
        rows.append([f"{model} {layout}", r["batch1"], r["batch1"] / base["batch1"],
                     r["out_tok_s"], r["total_tok_s"], r["total_tok_s"] / base["total_tok_s"],
                     f"{same}/32", r["start_s"]])
        print(rows[-1], flush=True)
    print_table(f"{title}, dummy bf16, {a.num} x {a.in_len} in / {a.out_len} out offline, "
                f"batch-1 decode of {a.decode_len}"
                + (" (no CUDA graphs)" if a.disable_cuda_graph else ""),
                ["run", "batch-1 tok/s", "vs tp4", f"batch-{a.num} out tok/s",
                 "offline total tok/s", "vs tp4", "greedy = tp4", "start s"], rows)

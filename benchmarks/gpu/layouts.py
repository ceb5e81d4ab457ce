"""Parallel layouts of one model against a reference layout (bench_ep.py, bench_pp.py): for each
layout an Engine (dummy bf16, same seed), its first 32 greedy tokens compared with the first
layout's, batch-1 decode tok/s and an offline batch's throughput, printed as one table with the
ratios to the first layout (tp4 by default).

``--smoke``: the same path end to end on CPU (gloo ranks) with a shrunken copy of the model's
config (4 layers, hidden 64, 8 experts) and a handful of tokens, to check the script itself
before a GPU call (greedy agreement is exact there: fp32)."""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import traceback
from pathlib import Path

import torch

from common import model_dir, print_table, random_prompts, time_decode

# Shrinks any of the carried configs to a CPU-sized model of the same architecture.
SMOKE_CONFIG = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, num_experts=8, num_local_experts=8, num_experts_per_tok=2,
                    max_position_embeddings=16384, torch_dtype="float32")
SMOKE_SIZES = dict(num=4, in_len=24, out_len=4, prompt_len=16, decode_len=6)


def greedy(n: int) -> dict:
    return {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}


def add_args(ap: argparse.ArgumentParser, layouts: str, num: int, in_len: int,
             out_len: int) -> None:
    ap.add_argument("--layouts", default=layouts,
                    help="comma-separated; the first is the reference of the ratios")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-len", type=int, default=128)
    ap.add_argument("--num", type=int, default=num)
    ap.add_argument("--in-len", type=int, default=in_len)
    ap.add_argument("--out-len", type=int, default=out_len)
    ap.add_argument("--graph-bs", type=int, default=None,
                    help="largest CUDA graph batch (default: the script's)")
    ap.add_argument("--disable-cuda-graph", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, gloo, a shrunken config, a few tokens: checks the script only")


def smoke_model_dir(model: str) -> str:
    """A temporary copy of ``model``'s config dir with the config shrunken (SMOKE_CONFIG)."""
    src = Path(model_dir(model))
    folder = Path(tempfile.mkdtemp(prefix=f"smoke-{model}-"))
    for f in src.iterdir():
        shutil.copy(f, folder / f.name)
    config = json.loads((src / "config.json").read_text())
    config.update({k: v for k, v in SMOKE_CONFIG.items() if k in config or "expert" not in k})
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def measure(path: str, kw: dict, a: argparse.Namespace, graph_bs: int) -> dict:
    from sgdsl.runtime import Engine

    one = random_prompts(1, a.prompt_len, seed=0)[0]
    prompts = random_prompts(a.num, a.in_len, seed=1)
    extra = dict(device="cpu", num_threads=1) if a.smoke else {}
    t0 = time.perf_counter()
    with Engine(model=path, load_format="dummy", max_running_requests=a.num,
                cuda_graph_max_bs=graph_bs, context_length=4096, chunked_prefill_size=8192,
                grammar_backend="none", disable_cuda_graph=a.disable_cuda_graph, **extra,
                **kw) as engine:
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


def world(kw: dict) -> int:
    return kw.get("tp_size", 1) * kw.get("pp_size", 1)


def row(label: str, r: dict, base: dict | None) -> list:
    """A layout's table row; its ratios and greedy agreement against ``base`` (the reference
    layout; "-" where the reference failed)."""
    if base is None:
        return [label, r["batch1"], "-", r["out_tok_s"], r["total_tok_s"], "-", "-", r["start_s"]]
    same = next((i for i, (x, y) in enumerate(zip(r["tokens"], base["tokens"])) if x != y),
                len(r["tokens"]))
    return [label, r["batch1"], r["batch1"] / base["batch1"], r["out_tok_s"], r["total_tok_s"],
            r["total_tok_s"] / base["total_tok_s"], f"{same}/32", r["start_s"]]


def compare(model: str, layouts: dict[str, dict], a: argparse.Namespace, title: str,
            graph_bs: int) -> None:
    """Measure ``a.layouts`` (names of ``layouts``) in order; the first is the reference."""
    names = a.layouts.split(",")
    unknown = [n for n in names if n not in layouts]
    assert not unknown, f"unknown layouts {unknown}; known: {sorted(layouts)}"
    if a.smoke:
        for k, v in SMOKE_SIZES.items():
            setattr(a, k, min(getattr(a, k), v))
        path = smoke_model_dir(model)
    else:
        need = max(world(layouts[n]) for n in names)
        assert torch.cuda.device_count() >= need, f"needs {need} GPUs"
        path = model_dir(model)
    graph_bs = a.graph_bs or graph_bs
    ref, results, rows = names[0], {}, []
    for layout in names:
        try:
            results[layout] = measure(path, layouts[layout], a, graph_bs)
        except Exception:  # a layout that fails (a GPU-only bug) must not cost the others
            traceback.print_exc()
            rows.append([f"{model} {layout}", "FAILED", "-", "-", "-", "-", "-", "-"])
            print(rows[-1], flush=True)
            continue
        rows.append(row(f"{model} {layout}", results[layout], results.get(ref)))
        print(rows[-1], flush=True)
    print_table(f"{title}, dummy {'fp32 smoke (CPU)' if a.smoke else 'bf16'}, {a.num} x "
                f"{a.in_len} in / {a.out_len} out offline, batch-1 decode of {a.decode_len}"
                + (" (no CUDA graphs)" if a.disable_cuda_graph else ""),
                ["run", "batch-1 tok/s", f"vs {ref}", f"batch-{a.num} out tok/s",
                 "offline total tok/s", f"vs {ref}", f"greedy = {ref}", "start s"], rows)

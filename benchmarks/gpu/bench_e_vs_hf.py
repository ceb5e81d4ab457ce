"""Workload E: 256 prompts x 1024 in x 256 out, Llama-3.1-8B (dummy bf16; ``--model`` e.g.
qwen3-30b-a3b), through our engine and through Hugging Face transformers' continuous-batching
``generate_batch`` in the same call. Target: ours >= 10x HF total tok/s. ``--hf-num`` runs HF
on the first N prompts only (its throughput at that batch), when the whole set would not fit
the call's time."""
from __future__ import annotations

import argparse
import gc
import time

import torch

from common import model_dir, print_table, random_prompts, run_engine


def run_hf(prompts: list[list[int]], out_len: int, model: str) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    cfg = AutoConfig.from_pretrained(model_dir(model))
    with torch.device("cuda"):
        # generate_batch switches the model to its paged attention itself
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    gcfg = GenerationConfig(max_new_tokens=out_len, do_sample=False, eos_token_id=None,
                            pad_token_id=0)
    model.generate_batch(prompts[:4], generation_config=gcfg)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate_batch(prompts, generation_config=gcfg)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    gen = sum(len(o.generated_tokens) for o in out.values())
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {"wall_s": wall, "in_tokens": sum(map(len, prompts)), "out_tokens": gen}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--hf-num", type=int, default=None)
    ap.add_argument("--mem-fraction", type=float, default=None,
                    help="mem_fraction_static (Qwen3-30B-A3B's 61 GB on an 80 GB card needs "
                         "room left for graphs and MoE workspaces)")
    a = ap.parse_args()
    prompts = random_prompts(a.num, 1024, seed=5)
    rows = []
    ours = run_engine(a.model, prompts, 256, max_running_requests=256,
                      cuda_graph_max_bs=256, chunked_prefill_size=8192,
                      max_prefill_tokens=16384, context_length=4096,
                      **({"mem_fraction_static": a.mem_fraction} if a.mem_fraction else {}))
    rows.append(["sgdsl", ours["wall_s"], (ours["in_tokens"] + ours["out_tokens"]) / ours["wall_s"]])
    print(rows[-1], flush=True)
    if not a.skip_hf:
        try:
            hf = run_hf(prompts[:a.hf_num or a.num], 256, a.model)
            rows.append([f"HF generate_batch ({a.hf_num or a.num} prompts)", hf["wall_s"],
                         (hf["in_tokens"] + hf["out_tokens"]) / hf["wall_s"]])
            rows.append(["ratio", hf["wall_s"] / ours["wall_s"], rows[0][2] / rows[1][2]])
        except Exception as e:  # report, keep our row
            rows.append(["HF generate_batch", "failed", f"{type(e).__name__}: {e}"[:120]])
    print_table(f"E: {a.num} x 1024 in x 256 out, {a.model}, ours vs HF",
                ["engine", "wall s", "total tok/s"], rows)


if __name__ == "__main__":
    main()

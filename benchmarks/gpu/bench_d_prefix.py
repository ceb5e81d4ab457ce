"""Workload D: shared prefix. 32 groups x 16 prompts: a 2048-token group system prompt + a
128-token question, 128 output tokens, at most 128 running; radix cache on vs off.
Target: cache-on >= 4x cache-off throughput, hit rate >= 87% (ideal 88%)."""
from __future__ import annotations

import argparse

from common import print_table, random_prompts, run_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--cache-on-only", action="store_true")
    a = ap.parse_args()
    systems = random_prompts(32, 2048, seed=3)
    questions = random_prompts(32 * 16, 128, seed=4)
    prompts = [systems[i // 16] + q for i, q in enumerate(questions)]
    rows = []
    for off in ((False,) if a.cache_on_only else (False, True)):
        r = run_engine(a.model, prompts, 128, max_running_requests=128, cuda_graph_max_bs=128,
                       disable_radix_cache=off, chunked_prefill_size=8192,
                       max_prefill_tokens=16384, context_length=4096,
                       kv_cache_dtype=a.kv_cache_dtype)
        rows.append(["off" if off else "on", r["wall_s"],
                     (r["in_tokens"] + r["out_tokens"]) / r["wall_s"], r["hit_rate"]])
        print(rows[-1], flush=True)
    ideal = (32 * 15 * 2048) / (512 * 2176)
    if len(rows) == 2:
        rows.append(["on/off speedup", rows[1][1] / rows[0][1], "", f"ideal hit {ideal:.3f}"])
    print_table(f"D: shared prefix, {a.model}, KV {a.kv_cache_dtype}, 32 x 16 x (2048 + 128) "
                "in, 128 out",
                ["radix cache", "wall s", "total tok/s", "hit rate"], rows)


if __name__ == "__main__":
    main()

"""Workload B: offline throughput, Llama-3.1-8B (dummy bf16), 1000 prompts x 1024 in x 256 out,
all submitted at once. Target on one H100: >= 20,000 total tok/s."""
from __future__ import annotations

import argparse

from common import print_table, random_prompts, run_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num", type=int, default=1000)
    ap.add_argument("--max-running", type=int, default=512)
    a = ap.parse_args()
    prompts = random_prompts(a.num, 1024, seed=1)
    r = run_engine("llama-3.1-8b", prompts, 256, max_running_requests=a.max_running,
                   cuda_graph_max_bs=a.max_running, chunked_prefill_size=8192,
                   max_prefill_tokens=16384, context_length=4096)
    total = (r["in_tokens"] + r["out_tokens"]) / r["wall_s"]
    print_table(f"B: offline throughput, llama-3.1-8b, {a.num} x 1024 in x 256 out",
                ["wall s", "total tok/s", "output tok/s", "target total tok/s"],
                [[r["wall_s"], total, r["out_tokens"] / r["wall_s"], 20000]])


if __name__ == "__main__":
    main()

"""Workload C (nano-vllm's): 256 sequences, input and output lengths uniform in [100, 1024],
Qwen2.5-0.5B config (dummy bf16). Throughput = output tokens / wall time, as nano-vllm
reports it. Target: >= 30,000 tok/s."""
from __future__ import annotations

import argparse
import random

from common import print_table, random_prompts, run_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overlap", choices=["on", "off", "both"], default="on")
    a = ap.parse_args()
    rng = random.Random(0)
    in_lens = [rng.randint(100, 1024) for _ in range(256)]
    out_lens = [rng.randint(100, 1024) for _ in range(256)]
    rows = []
    for overlap in {"on": [True], "off": [False], "both": [True, False]}[a.overlap]:
        r = run_engine("qwen2.5-0.5b", random_prompts(256, in_lens, seed=2), out_lens,
                       max_running_requests=256, cuda_graph_max_bs=256,
                       chunked_prefill_size=8192, max_prefill_tokens=16384,
                       context_length=4096, disable_overlap_schedule=not overlap)
        rows.append(["on" if overlap else "off", r["wall_s"], r["out_tokens"] / r["wall_s"],
                     (r["in_tokens"] + r["out_tokens"]) / r["wall_s"], 30000])
        print(rows[-1], flush=True)
    print_table("C: nano-vllm workload, qwen2.5-0.5b, 256 seqs, in/out ~ U[100, 1024]",
                ["overlap", "wall s", "output tok/s", "total tok/s", "target output tok/s"],
                rows)


if __name__ == "__main__":
    main()

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
``--smoke`` checks the script on CPU (gloo, a shrunken config). benchmarks/gpu/run_issue30_x4.sh
runs it.
"""
from __future__ import annotations

import argparse

import layouts

MODEL = "llama-3.1-70b"
LAYOUTS = {"tp4": dict(tp_size=4), "pp2-tp2": dict(pp_size=2, tp_size=2),
           "pp2-tp2-whole": dict(pp_size=2, tp_size=2, pp_micro_batches=1),
           "pp4": dict(pp_size=4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    layouts.add_args(ap, "tp4,pp2-tp2,pp2-tp2-whole", num=64, in_len=1024, out_len=128)
    a = ap.parse_args()
    layouts.compare(MODEL, LAYOUTS, a, "Pipeline parallelism", graph_bs=min(a.num, 256))


if __name__ == "__main__":
    main()

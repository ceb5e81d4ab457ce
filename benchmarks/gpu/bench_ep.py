"""Expert parallelism (issue 30 item 4): Qwen3-30B-A3B (128 experts, top-8; dummy bf16 weights)
on 4 GPUs at TP=4 vs EP=4 (default dispatch: auto) vs EP=4 in the all_reduce mode, in one run,
through the Engine (one process per rank, NCCL, CUDA graphs, overlap on), greedy:
- batch-1 decode tok/s = (out - 1) / (t(out tokens) - t(1 token)) (prefill cancels);
- offline: ``--num`` prompts of ``--in-len`` random tokens, ``--out-len`` out each, all at
  once: output tok/s and total (in + out) tok/s.
Ratios are printed against TP=4. The first 32 greedy tokens of one prompt are compared with
TP=4's (same dummy model; bf16 rounding may legitimately split them late).

Needs 4 GPUs (the device tool's nvidia-h100-x4 kind); from the repository root:
  source benchmarks/gpu/device_env.sh && python benchmarks/gpu/bench_ep.py
On 2 GPUs: ``--layouts tp2,ep2`` (the first layout is the ratios' reference; ``ep2-a2a``: the
all-to-all everywhere, as ``ep2`` ran before the auto mode). ``--smoke``
checks the script on CPU (gloo, a shrunken config). benchmarks/gpu/run_issue30_x4.sh runs it.
"""
from __future__ import annotations

import argparse

import layouts

MODEL = "qwen3-30b-a3b"
# epN: the default ep_dispatch (auto: the all-reduce everywhere); -a2a: the all-to-all everywhere
# (padded in graphs; "ep2"/"ep4" before the auto mode, RESULTS.md's 108.3 tok/s EP=2 row);
# -allreduce: forced all-reduce; -hybrid: auto with ep_a2a_min_tokens=1024 (prefill batches over
# the variable all-to-all; the first auto default, 0.861x TP=2 offline)
LAYOUTS = {"tp4": dict(tp_size=4), "tp2": dict(tp_size=2), "tp4-ep2": dict(tp_size=4, ep_size=2)}
for _n in (2, 4):
    LAYOUTS[f"ep{_n}"] = dict(tp_size=_n, ep_size=_n)
    LAYOUTS[f"ep{_n}-a2a"] = dict(tp_size=_n, ep_size=_n, ep_dispatch="all_to_all")
    LAYOUTS[f"ep{_n}-allreduce"] = dict(tp_size=_n, ep_size=_n, ep_dispatch="all_reduce")
    LAYOUTS[f"ep{_n}-hybrid"] = dict(tp_size=_n, ep_size=_n, ep_a2a_min_tokens=1024)


def main() -> None:
    ap = argparse.ArgumentParser()
    layouts.add_args(ap, "tp4,ep4,ep4-allreduce", num=256, in_len=512, out_len=256)
    a = ap.parse_args()
    layouts.compare(MODEL, LAYOUTS, a, "Expert parallelism", graph_bs=a.num)


if __name__ == "__main__":
    main()

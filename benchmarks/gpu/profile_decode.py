"""Where a batch-1 decode step's time goes: one captured decode step (CUDA graph replay) under
the torch profiler, kernels grouped by name (count, total us, share), against the step's wall
time and the weights-read floor (every weight byte the step must read once, at the measured
copy bandwidth). The gap between the sum of kernel times and the wall time is launch gaps and
host work; the gap between the kernels and the floor is kernels below bandwidth."""
from __future__ import annotations

import argparse
import collections

import torch

from common import Timer, model_dir, print_table
from driver import Driver
from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.runner import ModelRunner


def step_bytes(runner: ModelRunner) -> int:
    """Weight bytes one decode step reads: every parameter but the embedding (one row) and
    the experts' unchosen weights (MoE: top_k of num_experts)."""
    mc, total = runner.model_config, 0
    for name, p in runner.model.named_parameters():
        n = p.numel() * p.element_size()
        if "embed_tokens" in name:
            continue
        if ".experts." in name and mc.num_experts:
            n = n * mc.num_experts_per_tok // mc.num_experts
        total += n
    return total


def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy (read + write)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    with Timer() as t:
        for _ in range(10):
            b.copy_(a)
    return 2 * a.numel() * 10 / t.s


def print_sequence(prof, per_step: float, n: int) -> None:
    """The first ``n`` kernels of the last profiled step in start order: which neighbours a
    layer launches (what the grouped table hides)."""
    evs = sorted((ev for ev in prof.events()
                  if ev.device_type.name == "CUDA" and ev.device_time_total > 0),
                 key=lambda ev: ev.time_range.start)
    step = evs[-round(per_step):]
    rows = [[i, ev.name[:70], ev.device_time_total,
             ev.time_range.start - step[i - 1].time_range.end if i else 0.0]
            for i, ev in enumerate(step[:n])]
    print_table("one step in launch order", ["#", "kernel", "us", "gap us"], rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--sequence", type=int, default=0,
                    help="also list the first N kernels of one step in launch order")
    a = ap.parse_args()
    bw = copy_bandwidth()
    runner = ModelRunner(EngineConfig(model=model_dir(a.model), load_format="dummy",
                                      max_total_tokens=1024, max_running_requests=4,
                                      cuda_graph_max_bs=4, context_length=4096,
                                      quantization=a.quantization))
    d = Driver(runner)
    seq = d.new_seq(list(range(10, 138)))
    d.extend([seq])
    for _ in range(10):
        d.decode([seq])
    with Timer() as t:
        for _ in range(a.steps):
            d.decode([seq])
    wall_us = t.s / a.steps * 1e6
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(a.steps):
            d.decode([seq])
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type.name == "CUDA" and ev.device_time_total > 0:
            kernels[ev.name[:60]].append(ev.device_time_total)
    total = sum(sum(v) for v in kernels.values()) / a.steps
    count = sum(len(v) for v in kernels.values()) / a.steps
    rows = sorted(([k, len(v) / a.steps, sum(v) / a.steps, sum(v) / a.steps / total]
                   for k, v in kernels.items()), key=lambda r: -r[2])[:a.top]
    floor_us = step_bytes(runner) / bw * 1e6
    print_table(f"decode step kernels, {a.model} ({a.quantization or 'bf16'}), batch 1",
                ["kernel", "per step", "us per step", "share"], rows)
    print_table("decode step summary", ["what", "value"], [
        ["wall us per step (graph replay + argmax read back)", wall_us],
        ["kernel us per step (sum)", total], ["kernels per step", count],
        ["weight bytes per step (GB)", step_bytes(runner) / 1e9],
        ["copy bandwidth (TB/s)", bw / 1e12], ["weights-read floor us", floor_us],
        ["floor / wall", floor_us / wall_us], ["tok/s", 1e6 / wall_us]])
    if a.sequence:
        print_sequence(prof, count, a.sequence)
    from sgdsl.runtime.kernels.decode_gemm import choices

    print("decode GEMM choices (rows bucket, N, K, dtype):", choices())


if __name__ == "__main__":
    main()

"""Host time of one sampling launch with and without a grammar bitmask, by batch size: the
sampler's call returns once its kernels are queued, so its wall time is what the scheduler
thread pays on the critical path of a constrained step. Also the torch profiler's top host ops
of the masked call at one batch size.

    python benchmarks/gpu/bench_masked_sampling.py --batches 1 32 256 --profile 32
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from common import device_line, print_table
from sgdsl.runtime.grammar.base import allocate_bitmask
from sgdsl.runtime.layers.sampler import Sampler, SamplingBatchInfo
from sgdsl.runtime.sampling_params import SamplingParams

VOCAB = 128256


def host_us(sampler: Sampler, logits, info, mask, reps: int = 50) -> float:
    for _ in range(5):
        sampler.sample(logits, info, mask)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        sampler.sample(logits, info, mask)
    host = (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    return 1e6 * host


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--profile", type=int, default=32)
    a = ap.parse_args()
    print(device_line())
    sampler = Sampler(0, "cuda")
    rows = []
    for bs in a.batches:
        logits = torch.randn(bs, VOCAB, device="cuda")
        info = SamplingBatchInfo.from_params([SamplingParams(temperature=0.0)] * bs, VOCAB,
                                             "cuda")
        mask = allocate_bitmask(bs, VOCAB, pin=True).to("cuda", non_blocking=True)
        rows.append([bs, f"{host_us(sampler, logits, info, None):.0f}",
                     f"{host_us(sampler, logits, info, mask):.0f}"])
        print(rows[-1], flush=True)
        if bs == a.profile:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    sampler.sample(logits, info, mask)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    print_table("sampling launch, host us per call (greedy)", ["batch", "no mask", "mask"], rows)


if __name__ == "__main__":
    main()

"""Where a TP batch-1 decode step's time goes: the model runner alone (CUDA graph replay of one
decode step, no scheduler), with NCCL only and with the custom all-reduce, on N GPUs.

Compare its ms/step with bench_tp.py's per-token time through the Engine: the difference is
the scheduler's host work per step (TP lockstep, sampling bookkeeping, output), which a faster
all-reduce cannot remove.

    python probe_tp_step.py --tp 2 --model llama-3.1-8b
    python probe_tp_step.py --tp 4 --custom-ar on --pdl both   # programmatic dependent launch A/B

With PDL (runtime/kernels/pdl.py) a kernel starts before the one ahead of it ends and waits
inside, so its profiled time includes that wait: the per-kernel sums can grow while the step
(``ms/step GPU only``, replays back to back) shrinks. Compare the steps.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.multiprocessing as mp

from common import model_dir, print_table

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, tp: int, port: int, model: str, mode: tuple[bool, bool], steps: int,
              out: dict) -> None:
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.distributed import custom_all_reduce
    from sgdsl.runtime.distributed.state import get_tp_group, init_tp_group
    from sgdsl.runtime.kernels import pdl
    from sgdsl.runtime.model.runner import ModelRunner
    from tests.runtime.model.driver import RunnerDriver

    custom, pdl_on = mode
    pdl.set_enabled(pdl_on)
    init_tp_group(rank, tp, torch.device(f"cuda:{rank}"), f"tcp://127.0.0.1:{port}")
    config = EngineConfig(model=model_dir(model), load_format="dummy", tp_size=tp,
                          max_running_requests=4, cuda_graph_max_bs=4, context_length=4096,
                          grammar_backend="none", disable_custom_all_reduce=not custom)
    runner = ModelRunner(config)
    driver = RunnerDriver(runner)
    req = driver.new_request()
    token = int(driver.extend([(req, list(range(1, 129)))]).argmax(-1)[0])
    for _ in range(20):
        token = int(driver.decode([(req, token)]).argmax(-1)[0])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        token = int(driver.decode([(req, token)]).argmax(-1)[0])  # host sync, as the engine's
    ms = (time.perf_counter() - t0) * 1e3 / steps
    batch = _last_batch(runner, driver, req, token)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):  # the same step replayed back to back: the GPU's time alone
        runner.forward(batch)
    torch.cuda.synchronize()
    gpu_ms = (time.perf_counter() - t0) * 1e3 / steps
    if custom == (tp > 1):  # every rank replays (their all-reduces meet); rank 0 prints
        _kernel_table(runner, batch, f"{model} TP={tp} custom={custom} PDL={pdl_on}",
                      show=rank == 0)
    ar = custom_all_reduce.lookup(get_tp_group())
    if rank == 0:
        out[mode] = [f"{model} TP={tp} runner decode step, "
                     f"{'custom all-reduce' if ar else 'NCCL only'}"
                     f"{', PDL' if pdl.enabled(batch.input_ids) else ''}", ms, gpu_ms,
                     str(dict(ar.calls)) if ar else "-"]


def _kernel_table(runner, batch, title: str, show: bool, replays: int = 20) -> None:
    """GPU time per kernel over ``replays`` replays of the step (torch.profiler), per step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            runner.forward(batch)
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            name = e.name[:70]
            n, us = rows.get(name, (0, 0.0))
            dt = (getattr(e, "self_device_time_total", None) or getattr(e, "device_time", 0)
                  or getattr(e, "cuda_time", 0))
            rows[name] = (n + 1, us + dt)
    if not show:
        return
    total = sum(us for _, us in rows.values()) / replays
    print(f"\n## kernels of one decode step, {title}: {total:.0f} us of GPU time per step")
    for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:22]:
        print(f"{us / replays:8.1f} us  {n // replays:4d}x  {name}")


def _last_batch(runner, driver, req, token):
    """The ForwardBatch of one more decode step (caught on its way to the runner)."""
    seen = []
    forward = runner.forward
    runner.forward = lambda batch: seen.append(batch) or forward(batch)
    try:
        driver.decode([(req, token)])
    finally:
        runner.forward = forward
    return seen[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--custom-ar", choices=["on", "off", "both"], default="both",
                    help="TP runs with the custom all-reduce, NCCL only, or both")
    ap.add_argument("--pdl", choices=["on", "off", "both"], default="off",
                    help="with programmatic dependent launch (SGDSL_PDL), without, or both")
    a = ap.parse_args()
    both = {"on": (True,), "off": (False,), "both": (False, True)}
    modes = [(custom, pdl) for pdl in both[a.pdl]
             for custom in (both[a.custom_ar] if a.tp > 1 else (False,))]
    out = mp.Manager().dict()
    for mode in modes:
        mp.spawn(rank_main, args=(a.tp, _port(), a.model, mode, a.steps, out), nprocs=a.tp)
    rows = [out[m] for m in modes if m in out]
    print_table("TP decode step of the model runner alone (graph replay + argmax on the host)",
                ["run", "ms/step (host sync)", "ms/step GPU only",
                 "eager custom calls (warm-up, prefill)"], rows)
    for (custom, pdl), row in ((m, out.get(m)) for m in modes):
        base = out.get((custom, False)) if pdl else None
        if base and row:
            print(f"PDL on / off, {row[0]}: GPU step {base[2] * 1e3:.0f} -> {row[2] * 1e3:.0f} us "
                  f"({base[2] / row[2]:.3f}x), host-synced step {base[1] * 1e3:.0f} -> "
                  f"{row[1] * 1e3:.0f} us")


if __name__ == "__main__":
    main()

"""Quick timing of the raw ``ModelRunner.forward`` decode step (not a test; run by hand):

    python -m tests.runtime.model.perf_decode --threads 2 --steps 60 [--model DIR --dummy]

Batch-1 decode after a 100-token prompt on the embedded SmolLM2 (fp32, CPU), or on random
weights at DIR's config. Steps of the two paths are interleaved so load from other processes
hits both alike: the module path (torch ops per layer, MKL matmuls) and the fast path
(``CpuDecoder``: C kernels + C matvec). Also prints two matmul floors, i.e. what a step's
projection + logits matmuls cost with nothing else: MKL's batched gemm and the C matvec.
Times are wall (``perf_counter``) and process CPU time; medians and minima over the steps.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.layers import cpu_kernels
from sgdsl.runtime.model.runner import ModelRunner

from .driver import RunnerDriver


def _stats(name: str, wall: list[float], cpu: list[float]) -> str:
    med = statistics.median(wall)
    return (f"{name:<22} wall median {med * 1e3:6.2f} ms ({1 / med:5.1f}/s) min "
            f"{min(wall) * 1e3:6.2f} | cpu median {statistics.median(cpu) * 1e3:6.2f} ms")


def _timed(fn: Callable[[], object], wall: list[float], cpu: list[float]) -> object:
    c, t = time.process_time(), time.perf_counter()
    out = fn()
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
    return out


def _floors(runner: ModelRunner) -> dict[str, Callable[[], None]]:
    kernels = cpu_kernels.load()
    mats = [m.weight.data for m in runner.model.modules()
            if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 3]
    if runner.model.lm_head is None:  # tied: the logits matrix is a separate copy
        mats.append(runner.model._logits_weight)
    xs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in mats}
    jobs = [(xs[w.shape[1]].expand(w.shape[0], 1, w.shape[1]), w,
             torch.empty(w.shape[0], 1, w.shape[2])) for w in mats]

    def mkl() -> None:
        for x, w, out in jobs:
            torch.bmm(x, w, out=out)

    def c_matvec() -> None:
        for x, w, out in jobs:
            kernels.matvec(x.data_ptr(), 1, w.data_ptr(), out.data_ptr(), *w.shape)

    return {"floor mkl bmm": mkl, "floor C matvec": c_matvec} if kernels else {"floor mkl bmm": mkl}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dummy", action="store_true")
    args = ap.parse_args()
    extra = {"load_format": "dummy"} if args.dummy else {}
    runner = ModelRunner(EngineConfig(model=args.model, device="cpu", max_total_tokens=4096,
                                      max_running_requests=4, num_threads=args.threads, **extra))
    fast, kernels = runner.cpu_decoder, runner.model._cpu_kernels
    d = RunnerDriver(runner)
    paths = {"module path": (None, None), "fast path": (fast, kernels)}
    state = {}
    for name in paths:
        req = d.new_request()
        state[name] = [req, int(d.extend([(req, list(range(1, args.prompt_len + 1)))]).argmax())]
    times = {name: ([], []) for name in [*paths, *_floors(runner)]}
    floors, tokens = _floors(runner), {name: [] for name in paths}
    with torch.inference_mode():
        for _ in range(args.steps):
            for name, (dec, kern) in paths.items():
                runner.cpu_decoder, runner.model._cpu_kernels = dec, kern
                req, tok = state[name]
                logits = _timed(lambda: d.decode([(req, tok)]), *times[name])
                state[name][1] = int(logits.argmax())
                tokens[name].append(state[name][1])
            for name, fn in floors.items():
                _timed(fn, *times[name])
    print(f"threads={args.threads} steps={args.steps} load={os.getloadavg()[0]:.2f} "
          f"same greedy tokens: {tokens['module path'] == tokens['fast path']}")
    for name, (wall, cpu) in times.items():
        print(_stats(name, wall, cpu))


if __name__ == "__main__":
    main()

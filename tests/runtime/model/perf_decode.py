"""Quick timing of the raw ``ModelRunner.forward`` decode step (not a test; run by hand):

    python -m tests.runtime.model.perf_decode --threads 2 --steps 60

Prints the median/min ms per batch-1 decode step on the embedded SmolLM2 (fp32, CPU) after a
100-token prompt, next to a "matmul floor": the same step's projection and logits matmuls run
back to back with nothing else, i.e. what the step would cost with zero overhead elsewhere.
The machine is shared, so compare numbers taken in the same run only.
"""
from __future__ import annotations

import argparse
import time

import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.layers.linear import split_matmul
from sgdsl.runtime.model.runner import ModelRunner

from .driver import RunnerDriver


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--prompt-len", type=int, default=100)
    args = ap.parse_args()
    runner = ModelRunner(EngineConfig(device="cpu", max_total_tokens=4096,
                                      max_running_requests=4, num_threads=args.threads))
    d = RunnerDriver(runner)
    req = d.new_request()
    tok = int(d.extend([(req, list(range(1, args.prompt_len + 1)))]).argmax())
    mats = [m.weight for m in runner.model.modules()
            if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 3]
    if runner.model.lm_head is None:  # tied: the logits matrix is a separate copy
        mats.append(runner.model._logits_weight)
    xs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in mats}
    step, floor = [], []
    with torch.inference_mode():
        for _ in range(args.steps):
            t = time.perf_counter()
            tok = int(d.decode([(req, tok)]).argmax())
            step.append(time.perf_counter() - t)
            t = time.perf_counter()
            for w in mats:
                split_matmul(xs[w.shape[1]], w)
            floor.append(time.perf_counter() - t)
    step.sort()
    floor.sort()
    med = step[len(step) // 2]
    print(f"threads={args.threads} decode step: median {med * 1e3:.1f} ms ({1 / med:.1f} tok/s), "
          f"min {step[0] * 1e3:.1f} ms; matmul floor: median {floor[len(floor) // 2] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()

"""What an eager mixed forward costs (grammar jump-forward at batch): an extend whose rows are
decode rows (one token on a cached prefix) beside a few jump-forward rows (several tokens),
against the captured decode step of the same batch. Host time of the launch (no sync) and
device time per forward, then a cProfile of the eager launch (top functions by own time).

It is why the scheduler feeds jump-forward tokens as decode rows that replay the graphs
(``RunningBatch.mixed_batch``) rather than as such an extend: on the H100 the eager forward
of Llama-3.1-8B was launch-bound at ~20 ms (benchmarks/RESULTS.md, seventh session).

    python benchmarks/gpu/profile_mixed_forward.py --batches 32 256 --jumpers 4 --forced 6
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from common import device_line, model_dir
from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode
from sgdsl.runtime.model.runner import ModelRunner


def build(runner: ModelRunner, bs: int, jumpers: int, forced: int, prefix: int,
          mixed: bool) -> ForwardBatch:
    """Rows 0..bs-1 own prefix+forced slots each (request row r -> slots r*stride...); the
    last ``jumpers`` rows feed ``forced`` tokens when ``mixed``."""
    dev = torch.device("cuda")
    stride = prefix + forced + 1
    table = runner.req_to_token_pool.req_to_token
    for r in range(bs):
        table[r, :stride] = torch.arange(r * stride, (r + 1) * stride, device=dev)
    lens = [forced if mixed and r >= bs - jumpers else 1 for r in range(bs)]
    t = lambda v: torch.tensor(v, dtype=torch.int64, device=dev)  # noqa: E731
    starts = [sum(lens[:r]) for r in range(bs)]
    pos = [prefix + j for n in lens for j in range(n)]
    slots = [r * stride + prefix + j for r, n in enumerate(lens) for j in range(n)]
    seq = [prefix + n for n in lens]
    mode = ForwardMode.EXTEND if mixed else ForwardMode.DECODE
    return ForwardBatch(
        mode, bs, t([7] * sum(lens)), t(pos), t(list(range(bs))), t(seq), t(slots),
        t([prefix] * bs), t(lens), t(starts),
        logits_indices=t([s + n - 1 for s, n in zip(starts, lens)]) if mixed else None,
        seq_lens_cpu=seq, extend_prefix_lens_cpu=[prefix] * bs, extend_seq_lens_cpu=lens)


def timed(runner: ModelRunner, batch: ForwardBatch, iters: int = 10) -> tuple[float, float]:
    """(host ms to launch, device ms per forward)."""
    for _ in range(3):
        runner.forward(batch)
    torch.cuda.synchronize()
    host = 0.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        t0 = time.perf_counter()
        runner.forward(batch)
        host += time.perf_counter() - t0
    end.record()
    end.synchronize()
    return 1e3 * host / iters, start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--jumpers", type=int, default=4)
    ap.add_argument("--forced", type=int, default=6)
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    print(device_line())
    config = EngineConfig(model=model_dir(a.model), load_format="dummy", context_length=1024,
                          max_running_requests=max(a.batches),
                          cuda_graph_max_bs=max(a.batches))
    runner = ModelRunner(config)
    with torch.inference_mode():
        for bs in a.batches:
            for mixed in (False, True):
                batch = build(runner, bs, a.jumpers, a.forced, a.prefix, mixed)
                host, dev = timed(runner, batch)
                print(f"bs {bs} {'mixed' if mixed else 'decode graph'}: launch {host:.2f} ms "
                      f"host, {dev:.2f} ms per forward", flush=True)
            prof = cProfile.Profile()
            prof.enable()
            runner.forward(batch)
            prof.disable()
            torch.cuda.synchronize()
            pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()

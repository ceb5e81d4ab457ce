"""Where a decode step's time goes inside the scheduler process, measured in-process (no IPC).

Builds a Scheduler over either a ``null`` runner (real pools, a forward that costs almost
nothing: isolates the scheduler's own per-step CPU work) or the real ``ModelRunner`` at a
carried config with dummy weights (on CUDA: also the GPU time of one decode step, by timing
graph replays alone). Submits ``--n`` requests at once and runs the scheduler loop to the end.

    python benchmarks/gpu/profile_scheduler.py --runner null --n 256 --out 512 [--cprofile]
    python benchmarks/gpu/profile_scheduler.py --runner model --model qwen2.5-0.5b --n 256
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sgdsl.runtime.cache.pool import ReqToTokenPool, TokenKVPool  # noqa: E402
from sgdsl.runtime.config import EngineConfig  # noqa: E402
from sgdsl.runtime.ipc import messages as m  # noqa: E402
from sgdsl.runtime.sampling_params import SamplingParams  # noqa: E402
from sgdsl.runtime.scheduler.scheduler import Scheduler  # noqa: E402

NULL_VOCAB = 256


class NullRunner:
    """Real request/KV pools; the 'model' maps each input token to a fixed next token."""

    def __init__(self, slots: int, max_reqs: int, context_len: int) -> None:
        self.req_to_token_pool = ReqToTokenPool(max_reqs + 8, context_len, "cpu")
        self.token_kv_pool = TokenKVPool(slots, 1, 1, 1, torch.float32, "cpu")
        self.context_len = context_len
        self.device = torch.device("cpu")

    def forward(self, b):
        ids = b.input_ids if b.logits_indices is None else b.input_ids[b.logits_indices]
        if b.logits_indices is None and not b.mode.is_decode:
            ids = b.input_ids[b.extend_start_loc + b.extend_seq_lens - 1]
        logits = torch.zeros(ids.shape[0], NULL_VOCAB)
        logits.scatter_(1, ((ids * 7 + 1) % NULL_VOCAB).view(-1, 1), 1.0)
        return logits


def make_scheduler(a) -> tuple[Scheduler, object]:
    cfg = dict(max_running_requests=a.max_running or a.n, chunked_prefill_size=8192, grammar_backend="none",
               disable_overlap_schedule=a.no_overlap)
    if a.runner == "null":
        ctx = a.shared + a.inp + a.out + 8
        runner = NullRunner(a.n * ctx, a.max_running or a.n, ctx)
        config = EngineConfig(**cfg)
    else:
        from common import model_dir
        from sgdsl.runtime.model.runner import ModelRunner

        config = EngineConfig(model=model_dir(a.model), load_format="dummy", context_length=4096,
                              cuda_graph_max_bs=a.max_running or a.n, **cfg)
        runner = ModelRunner(config)
    sent = []
    return Scheduler(runner, config, [0], None, sent.append), runner


def submit(sched: Scheduler, a, seed: int) -> None:
    """``a.n`` prompts of ``a.inp`` random tokens; with ``--groups G`` each group of n/G prompts
    starts with its own ``--shared``-token system prompt (workload D's shape)."""
    rng = random.Random(seed)
    vocab = 30000 if a.runner == "model" else NULL_VOCAB
    systems = [[rng.randrange(10, vocab) for _ in range(a.shared)] for _ in range(a.groups)]
    for i in range(a.n):
        ids = systems[i * a.groups // a.n] + [rng.randrange(10, vocab) for _ in range(a.inp)]
        p = SamplingParams(max_new_tokens=a.out, ignore_eos=True, temperature=0.0)
        sched.handle(m.TokenizedGenerateReq(f"{seed}-{i}", ids, p))


def run(sched: Scheduler, a, seed: int) -> tuple[float, int, int]:
    """(seconds in decode-only steps, number of those steps, total steps)."""
    submit(sched, a, seed)
    t_dec, n_dec, steps = 0.0, 0, 0
    while True:
        decoding = not sched.waiting and sched.chunked is None
        t0 = time.perf_counter()
        if not sched.step():
            break
        if decoding:
            t_dec += time.perf_counter() - t0
            n_dec += 1
        steps += 1
    return t_dec, n_dec, steps


def gpu_step_ms(runner, bs: int, ctx: int) -> float:
    """GPU time of one decode graph replay at ``bs`` x ``ctx`` (replays only, no scheduler)."""
    from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode

    g = runner.cuda_graph_runner
    dev = runner.device
    i64 = dict(dtype=torch.int64, device=dev)
    seq = torch.full((bs,), ctx, **i64)
    batch = ForwardBatch(ForwardMode.DECODE, bs, torch.ones(bs, **i64), seq - 1,
                         torch.arange(bs, **i64), seq, torch.ones(bs, **i64), seq - 1,
                         torch.ones(bs, **i64), torch.arange(bs, **i64))
    for _ in range(3):
        runner.forward(batch)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        runner.forward(batch)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / 20 * 1e3 if g else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", choices=["null", "model"], default="null")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--inp", type=int, default=64)
    ap.add_argument("--out", type=int, default=256)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--shared", type=int, default=0)
    ap.add_argument("--max-running", type=int, default=0, help="default: n")
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("--cprofile", action="store_true")
    a = ap.parse_args()
    if a.runner == "null":
        torch.set_num_threads(1)  # tiny tensors: threads only add spin-waits
    sched, runner = make_scheduler(a)
    a_warm = argparse.Namespace(**{**vars(a), "out": 4, "n": min(a.n, 8), "groups": 1})
    run(sched, a_warm, seed=1)  # warm-up: compiles, allocator
    prof = cProfile.Profile() if a.cprofile else None
    if prof:
        prof.enable()
    t0 = time.perf_counter()
    t_dec, n_dec, steps = run(sched, a, seed=2)
    t_all = time.perf_counter() - t0
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    st = sched.stats()
    print(f"runner={a.runner} n={a.n} in={a.shared}+{a.inp} out={a.out} "
          f"overlap={not a.no_overlap}: {steps} steps in {t_all:.2f} s, {n_dec} decode-only "
          f"steps, {t_dec / max(n_dec, 1) * 1e3:.3f} ms per decode step (wall, in-process); "
          f"cache hit rate {st['cache_hit_rate']:.3f} (cumulative)")
    if a.runner == "model" and torch.cuda.is_available():
        print(f"GPU decode step alone (graph replay): bs={a.n} ctx={a.inp + a.out // 2}: "
              f"{gpu_step_ms(runner, a.n, a.inp + a.out // 2):.3f} ms")


if __name__ == "__main__":
    main()

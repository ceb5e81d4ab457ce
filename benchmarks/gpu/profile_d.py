"""Workload D's time split by step kind, in-process on one model runner (no IPC).

Runs D's shape (32 groups x 16 prompts of a 2048-token system prompt + 128-token question,
128 out, at most 128 running) through a Scheduler three times on one runner: overlap on
(the engine's setting; total only), then overlap off with every forward synchronized and timed,
with cascade decode attention on and off. Then times graph replays of one D-shaped decode
step (128 requests, 8 groups of 16 sharing 2048 tokens + 192 own) with and without groups.

    python benchmarks/gpu/profile_d.py                       # GPU, Llama-3.1-8B dummy weights
    python benchmarks/gpu/profile_d.py --runner null --n 64  # CPU smoke run (no-op model)
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_scheduler import NullRunner, submit  # noqa: E402
from sgdsl.runtime.config import EngineConfig  # noqa: E402
from sgdsl.runtime.scheduler.scheduler import Scheduler  # noqa: E402

CUDA = torch.cuda.is_available()


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def timed_forward(runner, acc: collections.Counter):
    """runner.forward that synchronizes around each call and accounts it by kind."""
    real = runner.forward

    def forward(batch):
        sync()
        t0 = time.perf_counter()
        out = real(batch)
        sync()
        kind = "decode" if batch.mode.is_decode else "extend"
        acc[kind + "_s"] += time.perf_counter() - t0
        acc[kind + "_n"] += 1
        acc[kind + "_rows"] += batch.num_tokens
        acc["cascade_n"] += batch.shared_prefix is not None
        return out
    return forward


def counted_forward(runner, acc: collections.Counter):
    """runner.forward that only counts (no sync): what an overlapped run launched."""
    real = runner.forward

    def forward(batch):
        kind = "decode" if batch.mode.is_decode else "extend"
        acc[kind + "_n"] += 1
        acc[kind + "_rows"] += batch.num_tokens
        acc["cascade_n"] += batch.shared_prefix is not None
        return real(batch)
    return forward


def waited_host_ids(acc: collections.Counter):
    """Patch HostIds.tolist to add up the time the host waits for the device."""
    from sgdsl.runtime.scheduler import inflight

    real = inflight.HostIds.tolist

    def tolist(self):
        t0 = time.perf_counter()
        out = real(self)
        acc["wait_s"] += time.perf_counter() - t0
        return out
    inflight.HostIds.tolist = tolist
    return lambda: setattr(inflight.HostIds, "tolist", real)


def one_run(runner, config: EngineConfig, a, overlap: bool, cascade: bool, timed: bool) -> list:
    sched = Scheduler(runner, config.replace(disable_overlap_schedule=not overlap), [0], None,
                      lambda msg: None)
    if not cascade:
        sched.running.prefix_members = None
    acc: collections.Counter = collections.Counter()
    runner.forward = (timed_forward if timed else counted_forward)(runner, acc)
    restore = waited_host_ids(acc)
    submit(sched, a, seed=2)
    sync()
    t0 = time.perf_counter()
    while sched.step():
        pass
    sync()
    total = time.perf_counter() - t0
    del runner.forward  # back to the class method
    restore()
    hit = sched.stats()["cache_hit_rate"]
    sched.memory.flush()
    dec_ms = acc["decode_s"] / max(acc["decode_n"], 1) * 1e3
    return [f"overlap {'on' if overlap else 'off'}, cascade {'on' if cascade else 'off'}"
            + (", forwards timed" if timed else ""), total, acc["extend_n"], acc["extend_rows"],
            acc["extend_s"], acc["decode_n"], acc["decode_s"], dec_ms, acc["cascade_n"],
            acc["wait_s"], hit]


def replay_ms(runner, bs: int, groups: int, prefix: int, own: int, cascade: bool) -> float:
    """One D-shaped decode step (forward only) from the runner's captured graphs."""
    from sgdsl.runtime.layers.attention.shared_prefix import build_shared_prefix
    from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode

    dev, members = runner.device, bs // groups
    i64 = dict(dtype=torch.int64, device=dev)
    ctx = prefix + own
    table = runner.req_to_token_pool.req_to_token
    slots = torch.randperm(runner.token_kv_pool.size - 1)[: groups * prefix + bs * own] + 1
    for i in range(bs):
        g = i // members
        table[i, :prefix] = slots[g * prefix:(g + 1) * prefix].to(dev)
        base = groups * prefix + i * own
        table[i, prefix:ctx] = slots[base:base + own].to(dev)
    shared = build_shared_prefix(
        [(g * members, prefix, list(range(g * members, (g + 1) * members)))
         for g in range(groups)], bs, runner.attn_backend.prefix_members, dev) if cascade else None
    seq = torch.full((bs,), ctx, **i64)
    batch = ForwardBatch(ForwardMode.DECODE, bs, torch.ones(bs, **i64), seq - 1,
                         torch.arange(bs, **i64), seq, torch.zeros(bs, **i64), seq - 1,
                         torch.ones(bs, **i64), torch.arange(bs, **i64), shared_prefix=shared)
    for _ in range(3):
        runner.forward(batch)
    sync()
    t0 = time.perf_counter()
    for _ in range(20):
        runner.forward(batch)
    sync()
    return (time.perf_counter() - t0) / 20 * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", choices=["null", "model"], default="model")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--shared", type=int, default=2048)
    ap.add_argument("--inp", type=int, default=128)
    ap.add_argument("--out", type=int, default=128)
    ap.add_argument("--max-running", type=int, default=128)
    a = ap.parse_args()
    config = EngineConfig(max_running_requests=a.max_running, chunked_prefill_size=8192,
                          grammar_backend="none", context_length=4096,
                          cuda_graph_max_bs=a.max_running)
    if a.runner == "null":
        ctx = a.shared + a.inp + a.out + 8
        runner = NullRunner(a.n * ctx, a.max_running, ctx)
    else:
        from common import model_dir
        from sgdsl.runtime.model.runner import ModelRunner

        config = config.replace(model=model_dir(a.model), load_format="dummy")
        runner = ModelRunner(config)
    warm = argparse.Namespace(**{**vars(a), "n": 8, "groups": 2, "out": 4})
    one_run(runner, config, warm, True, True, False)  # Triton compiles, allocator warm-up
    rows = [one_run(runner, config, a, True, True, False),
            one_run(runner, config, a, True, False, False),
            one_run(runner, config, a, False, True, True),
            one_run(runner, config, a, False, False, True)]
    header = ["run", "total s", "extends", "extend tokens", "extend s", "decodes", "decode s",
              "ms/decode", "cascade decodes", "host wait s", "hit rate"]
    print(f"\n## D in-process breakdown, {a.runner} {a.model}, {a.n} x ({a.shared}+{a.inp}) "
          f"in, {a.out} out, <= {a.max_running} running")
    for r in [header] + rows:
        print("| " + " | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in r) + " |")
    if a.runner == "model" and runner.cuda_graph_runner is not None:
        for cascade in (False, True):
            ms = replay_ms(runner, a.max_running, 8, a.shared, 192, cascade)
            print(f"decode step replay, bs={a.max_running}, 8 groups x {a.shared} shared + 192 "
                  f"own: cascade {'on' if cascade else 'off'}: {ms:.3f} ms")


if __name__ == "__main__":
    main()

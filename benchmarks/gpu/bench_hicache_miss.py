"""What the hierarchical cache adds to a request that misses: the scheduler in-process, fed
distinct prompts only (nothing to load, every prompt written through to the host), with and
without HiCache, over the same model runner settings.

Per engine: the scheduler's steps (host wall of ``Scheduler.step``; on CUDA less the time it
waits for the device in reading a step's tokens: what the host itself spent), TTFT
(submission to the first token leaving the scheduler), the host syncs issued inside ``step``
(CUDA: ``Event``/``Stream``/device ``synchronize``; the reads of sampled ids count in both
engines), and HiCache's backups: how many, per step, and the host time to issue them. Then the
ratios hicache / radix. ``--concurrency`` requests are kept in flight (a finished one is
replaced at once), so prefills of new prompts land between decode steps, as below saturation.

    python benchmarks/gpu/bench_hicache_miss.py --device cpu --tiny --layers 32 --prompt 512
    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/bench_hicache_miss.py
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CONFIGS, print_table, random_prompts, tiny_model_dir  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default=str(CONFIGS / "llama-3.1-8b"))
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--tiny", action="store_true", help="the config at hidden 64 (CPU)")
    ap.add_argument("--layers", type=int, default=0, help="with --tiny: this many layers")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=2048, help="tokens per (distinct) prompt")
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4, help="requests kept in flight")
    ap.add_argument("--device-tokens", type=int, default=32768, help="the device KV pool")
    ap.add_argument("--hicache-ratio", type=float, default=4.0)
    ap.add_argument("--engines", default="radix,hicache,hicache:write_back",
                    help="radix, hicache[:write policy]; write_back copies nothing on a miss "
                         "(until evictions), so it separates the write-through's device-side "
                         "cost (copies beside the compute) from the rest of the tiers'")
    return ap.parse_args(argv)


def model_dir(a: argparse.Namespace) -> str:
    if not a.tiny:
        return a.model_config
    return tiny_model_dir(a.model_config, {"num_hidden_layers": a.layers} if a.layers else None)


class Syncs:
    """Counts host syncs (CUDA) and the time spent waiting in the sampled ids' reads."""

    def __init__(self) -> None:
        self.count = 0
        self.read_wait = 0.0
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> "Syncs":
        from sgdsl.runtime.scheduler import inflight

        if torch.cuda.is_available():
            for owner, name in ((torch.cuda.Event, "synchronize"),
                                (torch.cuda.Stream, "synchronize"), (torch.cuda, "synchronize")):
                self._wrap(owner, name, self._counted)
        self._wrap(inflight.HostIds, "tolist", self._timed)
        return self

    def _wrap(self, owner: Any, name: str, make: Any) -> None:
        fn = getattr(owner, name)
        self._saved.append((owner, name, fn))
        setattr(owner, name, make(fn))

    def _counted(self, fn: Any) -> Any:
        def counted(*args: Any, **kw: Any) -> Any:
            self.count += 1
            return fn(*args, **kw)
        return counted

    def _timed(self, fn: Any) -> Any:
        def timed(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.read_wait += time.perf_counter() - t
        return timed

    def __exit__(self, *exc: Any) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)


def build(a: argparse.Namespace, engine: str) -> Any:
    """``engine``: ``radix``, or ``hicache[:policy]`` (write_through unless named)."""
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.scheduler.scheduler import Scheduler

    name, _, policy = engine.partition(":")
    extra = {"enable_hierarchical_cache": True, "hicache_ratio": a.hicache_ratio,
             "hicache_write_policy": policy or "write_through"} if name == "hicache" else {}
    config = EngineConfig(model=model_dir(a), load_format="dummy", device=a.device,
                          max_total_tokens=a.device_tokens, context_length=a.prompt + 256,
                          grammar_backend="none", schedule_policy="fcfs",
                          max_running_requests=max(8, 2 * a.concurrency), **extra)
    runner = ModelRunner(config)
    clock: dict[str, list[float]] = {"first": {}, "done": set()}

    def send(msg: Any) -> None:
        for out in getattr(msg, "outs", ()):
            if out.new_ids and out.rid not in clock["first"]:
                clock["first"][out.rid] = time.perf_counter()
            if out.finish_reason is not None:
                clock["done"].add(out.rid)
    sched = Scheduler(runner, config, [], None, send)
    return sched, clock


def drive(sched: Any, clock: dict, prompts: list[list[int]], a: argparse.Namespace,
          tag: str) -> dict[str, Any]:
    """Keep ``--concurrency`` prompts in flight until all are done; per-step and per-request
    figures."""
    from sgdsl.runtime.ipc import messages as m
    from sgdsl.runtime.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=a.output_tokens, temperature=0.0, ignore_eos=True)
    queue, submitted, steps = list(enumerate(prompts)), {}, []
    transfer = getattr(sched.tree, "transfer", None)
    issued: list[float] = []  # host seconds of each transfer.backup call (timed here, so the
    if transfer is not None:  # figure means the same for trees that do not time it)
        backup = transfer.backup

        def timed_backup(*args: Any) -> Any:
            t = time.perf_counter()
            try:
                return backup(*args)
            finally:
                issued.append(time.perf_counter() - t)
        transfer.backup = timed_backup
    cache = [0.0]  # host seconds in the KV bookkeeping (match, load, cache, free, evict)
    for name in CACHE_CALLS:
        fn = getattr(sched.memory, name, None)
        if fn is not None:
            setattr(sched.memory, name, _timed_into(cache, fn))
    with Syncs() as syncs:
        while queue or len(clock["done"] & submitted.keys()) < len(submitted):
            while queue and len(submitted) - len(clock["done"] & submitted.keys()) < a.concurrency:
                i, ids = queue.pop(0)
                rid = f"{tag}{i}"
                submitted[rid] = time.perf_counter()
                sched.handle(m.TokenizedGenerateReq(rid, ids, params, stream=True))
            extends, wait0, sync0 = sched.counters["extend_steps"], syncs.read_wait, syncs.count
            t = time.perf_counter()
            sched.step()
            wall = time.perf_counter() - t
            steps.append((wall, wall - (syncs.read_wait - wait0), syncs.count - sync0,
                          sched.counters["extend_steps"] > extends))
        while sched.step():
            pass
    if transfer is not None:
        del transfer.backup
    for name in CACHE_CALLS:
        sched.memory.__dict__.pop(name, None)
    ttft = [clock["first"][rid] - t for rid, t in submitted.items()]
    return {"steps": steps, "ttft": ttft, "backups": len(issued), "issue": sum(issued),
            "cache": cache[0]}


# NOTE: the scheduler's calls into its KV memory (scheduler/memory.py) that may do tier work;
# nested ones (alloc_slots inside reserve_extend) are timed once, at the outer call
CACHE_CALLS = ("match", "load", "cache_chunk", "release", "reserve_decode", "reserve_extend",
               "issue_backups")


def _timed_into(acc: list[float], fn: Any) -> Any:
    def timed(*args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            acc[0] += time.perf_counter() - t
    return timed


def summarize(name: str, r: dict) -> list:
    steps = r["steps"]
    ms = lambda xs: 1e3 * statistics.median(xs) if xs else 0.0  # noqa: E731
    ext = [s for s in steps if s[3]]
    dec = [s for s in steps if not s[3]]
    ttft = sorted(r["ttft"])
    return [name, len(steps), ms([s[0] for s in ext]), ms([s[1] for s in ext]),
            ms([s[0] for s in dec]), ms([s[1] for s in dec]),
            1e3 * statistics.median(ttft), 1e3 * ttft[int(0.99 * (len(ttft) - 1))],
            sum(s[2] for s in steps) / len(steps), r["backups"],
            r["backups"] / len(steps), 1e3 * r["issue"] / max(r["backups"], 1),
            1e3 * r["issue"] / len(steps), 1e3 * r["cache"] / len(steps)]


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    prompts = random_prompts(a.requests + 2, a.prompt, seed=11)
    rows, results = [], {}
    for name in a.engines.split(","):
        sched, clock = build(a, name)
        drive(sched, clock, prompts[:2], a, "warm")  # first-use costs (kernels, allocators)
        results[name] = drive(sched, clock, prompts[2:], a, "r")
        rows.append(summarize(name, results[name]))
        assert sched.is_idle
        sched.memory.check_idle()
        getattr(sched.tree, "close", lambda: None)()  # copies in flight done before the pools go
        del sched, clock
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print_table(f"misses only: {a.requests} distinct {a.prompt}-token prompts, "
                f"{a.output_tokens} tokens out, {a.concurrency} in flight",
                ["engine", "steps", "extend step ms p50", "extend host ms p50",
                 "decode step ms p50", "decode host ms p50", "TTFT p50 ms", "TTFT p99 ms",
                 "syncs/step", "backups", "backups/step", "issue ms/backup", "issue ms/step",
                 "KV bookkeeping ms/step"],
                rows)
    names = [r[0] for r in rows]
    for hi in (r for r in rows if r[0].startswith("hicache") and "radix" in names):
        base = rows[names.index("radix")]
        print(f"{hi[0]} / radix: extend step {hi[2] / base[2]:.3f}x, decode step "
              f"{hi[4] / base[4]:.3f}x, TTFT p50 {hi[6] / base[6]:.3f}x, "
              f"syncs/step +{hi[8] - base[8]:.2f}, KV bookkeeping ms/step "
              f"+{hi[13] - base[13]:.3f}", flush=True)


if __name__ == "__main__":
    main()

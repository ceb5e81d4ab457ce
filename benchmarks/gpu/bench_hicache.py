"""Multi-turn chat through a device KV pool far smaller than the working set: the radix cache
alone vs the hierarchical cache (host pool), in one run (issue 26's acceptance).

Each of ``--conversations`` users opens with a ``--history``-token context and then sends
``--turns`` turns; turn t's prompt is the whole conversation so far (the previous prompt, the
model's answer, a new ``--user-tokens`` user message), as a chat server sees it (token ids,
greedy, ``--output-tokens`` per answer, ignore_eos). When users send their turns is the load
point (``--rates``, see chat_load.py), each run in order in every engine, the cache flushed
between them:

- ``closed``: every user at once, the next turn as soon as the answer is in. The engine is
  always saturated, so TTFT is mostly queueing (about conversations / throughput).
- ``think:Z``: users who read and type for about Z s between turns (first turns spread over
  Z s): about conversations / Z turns per second, every conversation live all run. Below
  the radix engine's capacity, TTFT is what one turn costs amid the others' decodes.
- a number R: conversations arriving at R per second (Poisson), thinking ``--think-time``.

With the device pool capped (``--device-tokens``, max_total_tokens) at a quarter of the
working set or less, an LRU device cache loses a conversation's prefix unless its next turn
comes soon; the host tier keeps it. Every engine gets the same options except the
hierarchical cache's.

Engines (``--engines``): ``radix``, ``hicache`` and ``radix2``, a second radix run: its
agreement with ``radix`` is the noise floor of the greedy comparison (bf16 and batch
composition flip near-ties, and dummy weights make near-ties common). Per engine and load
point: offered and served turns/s, output tokens/s, TTFT p50/p99/mean, TTFT p50 of first turns
and p50/p99 of later turns, the live working set (time-averaged context of the conversations
in progress) over the device pool, the cached share of prompt tokens (and ``cacheable``: the
most any cache could give), retractions and the HiCache counters; then per load point the
ratios and the answer agreement (first turns, and turns whose whole prompt was identical).

    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/bench_hicache.py
    python3 benchmarks/gpu/bench_hicache.py --conversations 96 --turns 3 --device-tokens 40960 \\
        --hicache-ratio 10 --schedule-policy fcfs --engines radix,hicache \\
        --rates think:16,think:8,closed    # light and heavy interactive loads, then saturation
    python benchmarks/gpu/bench_hicache.py --device cpu --tiny --conversations 6 --turns 3 \\
        --history 200 --user-tokens 16 --output-tokens 4 --device-tokens 500 \\
        --rates think:1,closed    # CPU smoke
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_load import LoadPoint, Occupancy, parse_points  # noqa: E402
from common import CONFIGS, print_table, random_prompts, tiny_model_dir  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default=str(CONFIGS / "llama-3.1-8b"))
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--tiny", action="store_true", help="the config at 2 layers, hidden 64")
    ap.add_argument("--conversations", type=int, default=128)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--history", type=int, default=2048, help="tokens before the first turn")
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--device-tokens", type=int, default=65536,
                    help="max_total_tokens: the device KV pool (the working set is printed)")
    ap.add_argument("--hicache-size", type=float, default=0.0,
                    help="host pool GB (0: --hicache-ratio x the device pool)")
    ap.add_argument("--hicache-ratio", type=float, default=6.0)
    ap.add_argument("--write-policy", default="write_through",
                    choices=["write_through", "write_back", "write_through_selective"])
    ap.add_argument("--max-running", type=int, default=128)
    ap.add_argument("--schedule-policy", default="lpm", choices=["lpm", "fcfs"])
    ap.add_argument("--think-time", type=float, default=0.0,
                    help="mean seconds a user reads and types before the next turn "
                         "(uniform in [Z/2, 3Z/2]; 0: none)")
    ap.add_argument("--rates", default="closed",
                    help="load points, run in order in each engine (chat_load.py): 'closed' "
                         "(every conversation at once, the next turn right after the answer, "
                         "or after --think-time), 'think:Z' (the users think Z s), or "
                         "conversations arriving per second (Poisson), e.g. "
                         "think:16,think:8,closed")
    ap.add_argument("--engines", default="radix,hicache,radix2",
                    help="comma list of radix, hicache, radix2 (a repeat of radix)")
    ap.add_argument("--trace", default=None,
                    help="record each engine's scheduler steps ($SGDSL_STEP_TRACE) in "
                         "TRACE/<engine> and print their summaries (step_trace_report.py)")
    return ap.parse_args(argv)


def model_dir(a: argparse.Namespace) -> str:
    """The model config dir; with --tiny a copy of its config at a tiny size, same tokenizer."""
    return tiny_model_dir(a.model_config) if a.tiny else a.model_config


def workload(a: argparse.Namespace) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Per conversation: the opening history and each turn's user message (seeded ids)."""
    n = a.conversations
    histories = random_prompts(n, a.history, seed=1)
    users = [random_prompts(a.turns, a.user_tokens, seed=100 + c) for c in range(n)]
    return histories, users


async def conversation(engine: Any, history: list[int], users: list[list[int]],
                       out_tokens: int, waits: list[float], t0: float, turns: list[dict],
                       answers: list[list[int]], occupancy: Occupancy) -> None:
    """One user: its turns in order, each ``waits[t]`` seconds after the previous answer (turn
    0: after the run's start ``t0``); per turn its TTFT and meta_info (``turns``) and its answer
    (``answers``); its span and final context go to ``occupancy``."""
    context = list(history)
    params = {"max_new_tokens": out_tokens, "ignore_eos": True, "temperature": 0.0}
    await asyncio.sleep(max(0.0, t0 + waits[0] - time.perf_counter()))
    begin = time.perf_counter()
    for t, (user, wait) in enumerate(zip(users, waits)):
        if t and wait:
            await asyncio.sleep(wait)
        context += user
        start = time.perf_counter()
        first, out = None, []
        async for chunk in await engine.async_generate(input_ids=context, sampling_params=params,
                                                       stream=True):
            if first is None and chunk["output_ids"]:
                first = time.perf_counter() - start
            out, meta = chunk["output_ids"], chunk["meta_info"]
        ttft = first if first is not None else time.perf_counter() - start
        turns.append({"turn": t, "ttft": ttft, **meta})
        answers.append(list(out))
        context += out
    occupancy.add(begin, time.perf_counter(), len(context))


def engine_kwargs(a: argparse.Namespace, hicache: bool) -> dict[str, Any]:
    longest = a.history + a.turns * (a.user_tokens + a.output_tokens)
    kw: dict[str, Any] = dict(load_format=a.load_format, device=a.device,
                              max_total_tokens=a.device_tokens, context_length=longest + 64,
                              max_running_requests=a.max_running, grammar_backend="none",
                              schedule_policy=a.schedule_policy)
    if hicache:
        kw.update(enable_hierarchical_cache=True, hicache_ratio=a.hicache_ratio,
                  hicache_size=a.hicache_size, hicache_write_policy=a.write_policy)
    return kw


def run(a: argparse.Namespace, hicache: bool, points: list[LoadPoint]
        ) -> list[tuple[dict[str, Any], list[list[list[int]]]]]:
    """One engine through every load point (the cache flushed before each): per point its
    summary and every conversation's answers."""
    from sgdsl.runtime import Engine

    histories, users = workload(a)
    out = []
    with Engine(model=model_dir(a), **engine_kwargs(a, hicache)) as engine:
        engine.generate(input_ids=random_prompts(2, 64, seed=7),
                        sampling_params={"max_new_tokens": 4})  # warm-up
        for point in points:
            engine.flush_cache()
            turns: list[dict] = []
            answers: list[list[list[int]]] = [[] for _ in histories]
            occupancy = Occupancy()

            async def clients() -> None:
                t0 = time.perf_counter()
                await asyncio.gather(*(
                    conversation(engine, h, u, a.output_tokens, point.pauses(c, a.turns), t0,
                                 turns, o, occupancy)
                    for c, (h, u, o) in enumerate(zip(histories, users, answers))))

            before = engine.stats()
            start = time.perf_counter()
            asyncio.run(clients())
            wall = time.perf_counter() - start
            stats = _delta(before, engine.stats())
            engine.check_idle_integrity()
            out.append((summarize(a, point, wall, turns, stats, occupancy), answers))
    return out


def _delta(before: dict, after: dict) -> dict:
    """Counters over one load point (averages are recomputed by the caller; flags kept)."""
    return {k: v - before.get(k, 0) if isinstance(v, (int, float)) and k not in FLAGS else v
            for k, v in after.items()}


FLAGS = {"hicache_host_pinned", "hicache_io_kernel"}


def cacheable(a: argparse.Namespace) -> float:
    """The largest cached share any cache could reach: a first turn computes everything, a
    later turn at least its new user message (and the previous answer's last token, unless an
    overlapped step made its KV after the request had finished)."""
    prompt = computed = 0
    for t in range(a.turns):
        prompt += a.history + (t + 1) * a.user_tokens + t * a.output_tokens
        computed += a.history + a.user_tokens if t == 0 else a.user_tokens
    return 1 - computed / prompt


def _p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def summarize(a: argparse.Namespace, point: LoadPoint, wall: float, turns: list[dict],
              stats: dict, occupancy: Occupancy) -> dict[str, Any]:
    ttfts = [t["ttft"] for t in turns]
    later = [t["ttft"] for t in turns if t["turn"] > 0]
    prompt = sum(t["prompt_tokens"] for t in turns)
    loads = stats.get("hicache_loads_total", 0)
    return {"load": point.name,
            "offered_req_s": point.offered_turns_per_s(a.turns, a.conversations),
            "wall_s": wall, "req_s": len(turns) / wall,
            "out_tok_s": sum(t["completion_tokens"] for t in turns) / wall,
            "ttft_p50": _pct(ttfts, 0.5), "ttft_p99": _pct(ttfts, 0.99),
            "ttft_mean": statistics.mean(ttfts),
            "p50_turn1": _p50([t["ttft"] for t in turns if t["turn"] == 0]),
            "p50_later": _pct(later, 0.5), "p99_later": _pct(later, 0.99),
            "live_x_pool": occupancy.mean_live_tokens(wall) / a.device_tokens,
            "peak_live": occupancy.peak_live(),
            "cached": sum(t["cached_tokens"] for t in turns) / prompt,
            "cacheable": cacheable(a),
            "retractions": stats.get("retractions_total", 0),
            "host_hits": stats.get("hicache_host_hit_tokens", 0),
            "loads": loads,
            "h2d_gb": stats.get("hicache_bytes_host_to_device", 0) / 2**30,
            "d2h_gb": stats.get("hicache_bytes_device_to_host", 0) / 2**30,
            "load_ms": 1e3 * stats.get("hicache_load_seconds_total", 0.0) / loads if loads
            else 0.0,
            # host time queueing one load / one backup (CUDA): a blocking copy shows here
            "load_issue_ms": 1e3 * stats.get("hicache_load_issue_seconds_total", 0.0) / loads
            if loads else 0.0,
            "backup_issue_ms": 1e3 * stats.get("hicache_backup_issue_seconds_total", 0.0)
            / max(stats.get("hicache_backups_total", 0), 1),
            "pinned": stats.get("hicache_host_pinned", "-"),
            "io_kernel": stats.get("hicache_io_kernel", "-")}


def agreement(x: list[list[list[int]]], y: list[list[list[int]]]) -> dict[str, str]:
    """Greedy answers of two runs. A turn's prompt holds every earlier answer, so after one
    flip the rest of that conversation differs anyway: the tight comparisons are the first
    turns (same prompt in every run) and the turns whose whole prompt was the same."""
    first = [cx[0] == cy[0] for cx, cy in zip(x, y)]
    same_prompt, all_turns = [], []
    for cx, cy in zip(x, y):
        for t, (ax, ay) in enumerate(zip(cx, cy)):
            all_turns.append(ax == ay)
            if cx[:t] == cy[:t]:
                same_prompt.append(ax == ay)
    frac = lambda v: f"{sum(v)}/{len(v)}"  # noqa: E731
    return {"first turns": frac(first), "same-prompt turns": frac(same_prompt),
            "all turns": frac(all_turns)}


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    points = parse_points(a.rates, a.think_time)
    per_conv = a.history + a.turns * (a.user_tokens + a.output_tokens)
    working = a.conversations * per_conv
    print(f"working set {working} tokens = {working / a.device_tokens:.1f}x the device pool "
          f"({a.device_tokens}); {a.conversations} conversations x {a.turns} turns; "
          f"schedule policy {a.schedule_policy}; think time {a.think_time} s; load points "
          + ", ".join(p.name for p in points), flush=True)
    names = [n.strip() for n in a.engines.split(",") if n.strip()]
    runs = {}
    for n in names:
        if a.trace:  # NOTE: read by the scheduler process the Engine spawns
            os.environ["SGDSL_STEP_TRACE"] = os.path.join(a.trace, n)
        runs[n] = run(a, n == "hicache", points)
    keys = list(runs[names[0]][0][0])
    rows = [[n, *(r[0][k] for k in keys)] for i in range(len(points)) for n, rs in runs.items()
            for r in [rs[i]]]
    print_table(f"multi-turn chat: radix cache vs hierarchical cache ({a.schedule_policy})",
                ["engine", *keys], rows)
    for i, point in enumerate(points):
        report(point, {n: rs[i] for n, rs in runs.items()})
    if a.trace:
        import step_trace_report

        for n in names:
            print(step_trace_report.summarize(os.path.join(a.trace, n, "steps-rank0.jsonl")))


def report(point: LoadPoint, runs: dict[str, tuple[dict, list]]) -> None:
    """One load point's ratios (hicache / radix) and answer agreement."""
    if "radix" in runs and "hicache" in runs:
        base, hi = runs["radix"][0], runs["hicache"][0]
        print(f"\n[{point.name}] throughput x{hi['req_s'] / base['req_s']:.2f} (hicache / radix), "
              f"TTFT p50 x{base['ttft_p50'] / hi['ttft_p50']:.2f} lower, "
              f"p99 x{base['ttft_p99'] / hi['ttft_p99']:.2f} lower, "
              f"mean x{base['ttft_mean'] / hi['ttft_mean']:.2f} lower, "
              f"later turns p50 x{base['p50_later'] / max(hi['p50_later'], 1e-9):.2f} lower")
    for other in ("radix2", "hicache"):
        if "radix" in runs and other in runs:
            same = agreement(runs["radix"][1], runs[other][1])
            print(f"[{point.name}] identical answers, radix vs {other}: "
                  + ", ".join(f"{k} {v}" for k, v in same.items()))


if __name__ == "__main__":
    main()

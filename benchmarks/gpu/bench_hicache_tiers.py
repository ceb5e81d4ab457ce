"""What one turn's TTFT costs by where its prefix's KV is: recomputed (a miss), on the device (a
device hit), or in the host tier (a host hit: the load back plus the suffix's prefill), one
request at a time on an idle engine, so each figure is that path's own cost and no queue's.

Per repetition, with a fresh ``--prefix``-token context: (1) ``miss``: context + suffix A (the
context is computed, cached and, write-through, copied to the host); (2) ``device hit``:
context + suffix B; (3) a filler prompt that takes nearly the whole device pool, so LRU
eviction demotes the context to the host; (4) ``host hit``: context + suffix C. The
``hicache`` engine also writes its pages to a fresh storage directory; a fourth engine started
afterwards on it (empty device and host tiers, as after a restart) serves (5) ``storage hit``:
context + suffix D (the pages read from files, then loaded as a host hit). The same
misses on an engine without the tiers (``radix miss``) show what write-through adds to a miss;
a third engine with SGDSL_HICACHE_DIRECT=0 (``gathered``: every move gathers the host
runs and scatters them, the copy path before pool-to-pool copies) shows what those save.
Each request generates one token (its latency is its TTFT); medians over ``--reps``.
``cached_tokens_details`` confirms which tier served each hit.

    python benchmarks/gpu/bench_hicache_tiers.py --device cpu --embedded --prefix 1024 --reps 5
    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/bench_hicache_tiers.py
    ... --tp-size 2   # each rank stores its shard; the ranks agree on every storage hit
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hicache import model_dir  # noqa: E402
from common import CONFIGS, print_table, random_prompts  # noqa: E402

from sgdsl.runtime.cache.hicache import transfer  # noqa: E402

ENGINES = {"radix": ({}, ""), "hicache": ({"enable_hierarchical_cache": True,
                                            "hicache_ratio": 8}, ""),
           "gathered": ({"enable_hierarchical_cache": True, "hicache_ratio": 8}, "0"),
           "storage": ({"enable_hierarchical_cache": True, "hicache_ratio": 8}, "")}
CASES = ("radix miss", "miss", "device hit", "host hit", "gathered miss", "gathered host hit",
         "storage hit")
STORED = ("hicache", "storage")  # the engines with the storage tier (one directory)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", default=str(CONFIGS / "llama-3.1-8b"))
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--tiny", action="store_true", help="the config at 2 layers, hidden 64")
    ap.add_argument("--embedded", action="store_true",
                    help="the embedded SmolLM2-135M with its weights (CPU dev box)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--prefix", type=int, default=2048, help="tokens of the cached context")
    ap.add_argument("--suffix", type=int, default=64, help="new tokens of each turn")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--storage-dir", default=None,
                    help="where the storage tier's fresh directory is made (default: $TMPDIR)")
    return ap.parse_args(argv)


def engine_kw(a: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    if a.embedded:
        from sgdsl.runtime.model.embedded import embedded_model_path

        model, fmt = str(embedded_model_path()), "auto"
    else:
        model, fmt = model_dir(a), a.load_format
    # NOTE: the pool holds the context and two suffixes and a bit (the device hit shares the
    # context): a filler prompt of nearly the pool's size then evicts everything
    pool = a.prefix + 2 * a.suffix + 128
    return dict(model=model, load_format=fmt, device=a.device, max_total_tokens=pool,
                context_length=pool, grammar_backend="none", max_running_requests=4,
                tp_size=a.tp_size, **extra)


def _ttft(engine: Any, ids: list[int]) -> tuple[float, dict]:
    start = time.perf_counter()
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1,
                                                          "temperature": 0.0})
    return time.perf_counter() - start, out["meta_info"]


def measure(a: argparse.Namespace, name: str) -> dict[str, list[tuple[float, dict]]]:
    """Per case, (seconds, meta_info) of each repetition on engine ``name`` (ENGINES)."""
    from sgdsl.runtime import Engine

    extra, direct = ENGINES[name]
    kw = engine_kw(a, extra)
    if name in STORED:
        kw.update(hicache_storage_backend="file", hicache_storage_dir=a.storage_run_dir)
    pool = kw["max_total_tokens"]
    cases: dict[str, list] = {}
    # NOTE: read by the scheduler process the Engine spawns (transfer.py, at import)
    os.environ["SGDSL_HICACHE_DIRECT"] = direct or ("1" if transfer.DIRECT else "0")
    prefix = "" if name == "hicache" else f"{name} "
    with Engine(**kw) as engine:
        _ttft(engine, random_prompts(1, a.prefix, seed=5)[0])  # warm-up at full length
        for rep in range(a.reps):
            engine.flush_cache()
            context = random_prompts(1, a.prefix, seed=100 + rep)[0]
            a_, b_, c_, d_ = random_prompts(4, a.suffix, seed=200 + rep)
            if name == "storage":  # NOTE: the hicache engine stored this context's pages
                cases.setdefault("storage hit", []).append(_ttft(engine, context + d_))
                continue
            cases.setdefault(prefix + "miss", []).append(_ttft(engine, context + a_))
            if name == "radix":
                continue
            if name == "hicache":
                cases.setdefault("device hit", []).append(_ttft(engine, context + b_))
            _ttft(engine, random_prompts(1, pool - 64, seed=300 + rep)[0])  # evicts the context
            cases.setdefault(prefix + "host hit", []).append(_ttft(engine, context + c_))
        engine.check_idle_integrity()
        _print_copies(name, engine.stats())
    return cases


def _print_copies(name: str, stats: dict) -> None:
    """Per load and backup: time on the copy stream, and host time queueing it (a copy that
    blocks the scheduler shows as issue time near the copy's own)."""
    loads, backups = stats.get("hicache_loads_total", 0), stats.get("hicache_backups_total", 0)
    if not loads:
        return
    ms = lambda key, n: 1e3 * stats.get(key, 0.0) / max(n, 1)  # noqa: E731
    print(f"{name}: host pool pinned {stats.get('hicache_host_pinned')}; {loads} loads: "
          f"{ms('hicache_load_seconds_total', loads):.2f} ms on the stream, "
          f"{ms('hicache_load_issue_seconds_total', loads):.2f} ms to queue; {backups} backups: "
          f"{ms('hicache_backup_issue_seconds_total', backups):.2f} ms to queue; "
          f"{stats.get('hicache_direct_moves_total', 0)} moves with pool-to-pool copies",
          flush=True)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hicache-tiers-", dir=a.storage_dir) as folder:
        a.storage_run_dir = folder  # fresh: the misses must not be storage hits
        cases = {k: v for name in ENGINES for k, v in measure(a, name).items()}
    miss = statistics.median(s for s, _ in cases["radix miss"])
    rows = []
    for name in CASES:
        secs = [s for s, _ in cases[name]]
        tiers = cases[name][-1][1].get("cached_tokens_details") or {}
        rows.append([name, 1e3 * statistics.median(secs), 1e3 * min(secs), 1e3 * max(secs),
                     miss / statistics.median(secs), tiers.get("device", 0),
                     tiers.get("host", 0), tiers.get("storage", 0)])
    print_table(f"one turn's TTFT by tier: {a.prefix}-token context + {a.suffix} new tokens, "
                f"{a.reps} reps, idle engine, tp_size {a.tp_size}",
                ["case", "median ms", "min ms", "max ms", "x faster than a miss",
                 "device tokens (last rep)", "host tokens (last rep)",
                 "storage tokens (last rep)"], rows)


if __name__ == "__main__":
    main()

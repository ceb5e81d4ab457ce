"""Grammar disk cache benchmark (issue 29 item 3): what a restart costs with and without the
on-disk cache of compiled grammars, on the real-world schema suite, in one run.

Per schema, the admission latency through ``GrammarCompiler`` (submit -> compiled grammar ready,
the request's wait): (1) cold, an empty cache folder (every schema compiled by a worker, then
written); (2) a restart on the same folder (a new compiler: every schema read from disk); (3) the
same restart with all schemas submitted at once (a burst: time until the last is ready); and, for
reference, the raw backend compile of the same schema in this process (xgrammar alone). Workers
are started and warm before each timed pass. Usage:

    python benchmarks/bench_grammar_disk_cache.py [--backend xgrammar|outlines] [--limit N]
        [--workers 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

DATA = Path(__file__).parents[1] / "tests" / "data" / "schemas" / "realworld"
VOCAB = 49152


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def keys(limit: int | None) -> dict:
    from sgdsl.runtime.grammar import GrammarKey

    paths = sorted(DATA.glob("*.json"))[:limit]
    return {p.stem: GrammarKey("json_schema", json.dumps(json.loads(p.read_text())))
            for p in paths}


def compiler(backend, folder: Path, workers: int):
    from sgdsl.runtime.grammar import GrammarCompiler, GrammarKey
    from sgdsl.runtime.grammar.compile.cache_identity import cache_identity
    from sgdsl.runtime.grammar.compile.disk_cache import GrammarDiskCache
    from sgdsl.runtime.grammar.compile.pool_limits import PoolLimits
    import functools

    disk = GrammarDiskCache(folder, backend.name, functools.partial(cache_identity, backend.spec))
    c = GrammarCompiler(backend, timeout_s=120.0, pool=PoolLimits(workers=workers), disk=disk)
    c.compile(GrammarKey("regex", "[a-z]+"))  # workers up; the disk index read
    return c


def one_at_a_time(c, ks: dict) -> dict[str, float | None]:
    """name -> seconds from submit to ready (None: rejected)."""
    from sgdsl.runtime.errors import InvalidRequestError

    out = {}
    for name, key in ks.items():
        t0 = time.perf_counter()
        try:
            c.compile(key)
            out[name] = time.perf_counter() - t0
        except InvalidRequestError:
            out[name] = None
    return out


def burst(c, ks: dict) -> tuple[float, list[float]]:
    """(seconds until every schema is decided, per-schema ready latencies)."""
    done: dict[str, float] = {}
    lock = threading.Lock()
    t0 = time.perf_counter()
    for name, key in ks.items():
        fut = c.submit(key).future()
        fut.add_done_callback(lambda f, n=name: _mark(done, lock, n))
    while len(done) < len(ks):
        time.sleep(0.001)
    return time.perf_counter() - t0, [t - t0 for t in done.values()]


def _mark(done: dict, lock: threading.Lock, name: str) -> None:
    with lock:
        done[name] = time.perf_counter()


def raw(tokenizer, ks: dict) -> dict[str, float | None]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB, stop_token_ids=[2])
    comp = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    out = {}
    for name, key in ks.items():
        t0 = time.perf_counter()
        try:
            comp.compile_json_schema(key.text, any_whitespace=False)
            out[name] = time.perf_counter() - t0
        except Exception:  # noqa: BLE001 - xgrammar's own rejection
            out[name] = None
    return out


def row(label: str, xs: list[float]) -> str:
    return (f"{label:<34} n={len(xs):>3}  p50 {1e3 * pct(xs, 0.5):8.1f} ms  "
            f"p99 {1e3 * pct(xs, 0.99):8.1f} ms  total {sum(xs):7.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="xgrammar", choices=["xgrammar", "outlines"])
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from sgdsl.runtime.grammar import create_grammar_backend
    from sgdsl.runtime.model.embedded import embedded_model_path

    tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    backend = create_grammar_backend(args.backend, tok, VOCAB)
    ks = keys(args.limit)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        c = compiler(backend, folder, args.workers)
        base = c.pool.stats.compiles  # the warm-up's (0 once it is on disk)
        cold = one_at_a_time(c, ks)
        compiles_cold = c.pool.stats.compiles - base
        c.shutdown()
        files = list(folder.rglob("*.grammar"))
        size = sum(p.stat().st_size for p in files)
        c = compiler(backend, folder, args.workers)
        base = c.pool.stats.compiles
        warm = one_at_a_time(c, ks)
        compiles_warm = c.pool.stats.compiles - base
        c.shutdown()
        c = compiler(backend, folder, args.workers)
        burst_s, burst_lat = burst(c, {n: k for n, k in ks.items() if cold[n] is not None})
        c.shutdown()
    ok = [n for n in ks if cold[n] is not None and warm[n] is not None]
    print(f"{args.backend}: {len(ks)} schemas, {len(ok)} admitted, {args.workers} workers; "
          f"compiles cold {compiles_cold}, after the restart {compiles_warm}; "
          f"{len(files)} files, {size / 1e6:.1f} MB on disk")
    print(row("cold (compiled, one at a time)", [cold[n] for n in ok]))
    print(row("restart (from disk, one at a time)", [warm[n] for n in ok]))
    print(row("restart, all at once (ready at)", burst_lat) + f"  last {burst_s:.2f} s")
    if args.backend == "xgrammar":
        rx = raw(tok, {n: ks[n] for n in ok})
        both = [n for n in ok if rx[n] is not None]
        print(row("raw xgrammar compile (reference)", [rx[n] for n in both]))
        print("per schema, restart / raw compile: p50 "
              f"{statistics.median(warm[n] / rx[n] for n in both):.2f}x")
    print("per schema, restart / cold: p50 "
          f"{statistics.median(warm[n] / cold[n] for n in ok):.3f}x")


if __name__ == "__main__":
    main()

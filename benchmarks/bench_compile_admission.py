"""Compile admission through the Engine (issue 29, items 2-3), on this box, in one run.

latency: each real-world schema (tests/data/schemas/realworld) one at a time to a fresh default
         ``Engine()`` (the first request after start-up included): time to the first streamed
         chunk of a json_schema request (max_new_tokens 256, aborted after that chunk), against,
         in this process, (a) xgrammar's ``compile_json_schema`` on the raw schema (what the
         issue measured), and (b) the backend's own compile of the key the engine compiles
         (normalize + compile). Also the unconstrained request's time to first chunk, and
         the engine's own split of each admission (queue wait, compile in the worker, load in
         the scheduler; from ``engine.stats()``). Target: p50 admission <= 2 x raw + 50 ms.
burst:   N distinct real-world schemas at once to a fresh default ``Engine()``: admitted,
         refused (by error type), p50/p99 time to first chunk, peak RSS of the engine's
         process tree (main, scheduler, compile and estimate workers).

    python benchmarks/bench_compile_admission.py [latency] [burst] [--limit N] [--burst N]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from pathlib import Path

from bench_grammar_flood import tree_rss

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "schemas" / "realworld"
PROMPT = "<|im_start|>user\nGive an example JSON value.<|im_end|>\n<|im_start|>assistant\n"
MAX_NEW = 256
STAGES = ("grammar_admission_seconds", "grammar_compile_wait_seconds",
          "grammar_compile_seconds", "grammar_compile_load_seconds")


def schemas(limit: int | None) -> dict[str, dict]:
    out = {p.stem: json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))}
    return dict(list(out.items())[:limit]) if limit else out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def first_chunk_s(eng, params: dict) -> tuple[float, str]:
    """Seconds to the first streamed chunk (then aborted), and 'ok' or the error's type."""
    t0 = time.perf_counter()
    stream = eng.generate(PROMPT, {**params, "max_new_tokens": MAX_NEW}, stream=True)
    try:
        next(stream)
        return time.perf_counter() - t0, "ok"
    except Exception as e:  # noqa: BLE001 - counted by type
        return time.perf_counter() - t0, type(e).__name__
    finally:
        stream.close()


_RAW: list = []


def _raw_init() -> None:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from sgdsl.runtime.model.embedded import embedded_model_path

    tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=49152, stop_token_ids=[2])
    _RAW.append(xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False))


def _raw_compile(text: str) -> float | None:
    t0 = time.perf_counter()
    try:
        _RAW[0].compile_json_schema(text, any_whitespace=False)
    except Exception:  # noqa: BLE001 - xgrammar's own refusal
        return None
    return time.perf_counter() - t0


class InProcess:
    """The two references: raw xgrammar on the raw schema (in a helper process, so a
    pathological raw compile, up to a minute on some Snowplow schemas, is cut at
    ``raw_timeout_s`` and counted apart); the backend's compile of the engine's key, here."""

    def __init__(self, raw_timeout_s: float) -> None:
        from transformers import AutoTokenizer

        from sgdsl.runtime.grammar import create_grammar_backend
        from sgdsl.runtime.grammar.compile.vacuous_bounds import longest_token_bytes
        from sgdsl.runtime.model.embedded import embedded_model_path

        tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
        self.backend = create_grammar_backend("xgrammar", tok, 49152)
        self.reach = MAX_NEW * longest_token_bytes(tok)
        self.raw_timeout_s = raw_timeout_s
        self._pool = self._raw_pool()

    @staticmethod
    def _raw_pool():
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(1, initializer=_raw_init)
        pool.apply(_raw_compile, ('{"type": "string"}',))  # started and warm
        return pool

    def raw_s(self, schema: dict) -> float | str | None:
        """Seconds; None: xgrammar refused it; "timeout": past ``raw_timeout_s``."""
        import multiprocessing as mp

        job = self._pool.apply_async(_raw_compile, (json.dumps(schema),))
        try:
            return job.get(self.raw_timeout_s)
        except mp.TimeoutError:
            self._pool.terminate()
            self._pool = self._raw_pool()
            return "timeout"

    def backend_s(self, schema: dict) -> float | None:
        from sgdsl.runtime.errors import InvalidRequestError
        from sgdsl.runtime.grammar import GrammarKey
        from sgdsl.runtime.grammar.compile.vacuous_bounds import drop_vacuous_bounds

        key = GrammarKey("json_schema", drop_vacuous_bounds(json.dumps(schema), 100_000,
                                                           self.reach))
        t0 = time.perf_counter()
        try:
            self.backend.compile(key)
        except InvalidRequestError:
            return None
        return time.perf_counter() - t0


def latency(args: argparse.Namespace) -> None:
    from sgdsl.runtime import Engine

    suite = dict(list(schemas(args.limit).items())[::args.stride])
    ref = InProcess(args.raw_timeout)
    rows = []
    empty_disk_cache()
    t0 = time.perf_counter()
    with Engine() as eng:
        print(f"engine start {time.perf_counter() - t0:.1f} s; "
              f"workers {eng.stats()['grammar_compile_workers']}")
        plain = [first_chunk_s(eng, {"temperature": 0})[0] for _ in range(3)]
        for name, schema in suite.items():
            before = eng.stats()
            admit, outcome = first_chunk_s(eng, {"json_schema": json.dumps(schema)})
            after = eng.stats()
            split = [after[k]["sum"] - before[k]["sum"] for k in STAGES]
            rows.append((name, admit, outcome, ref.raw_s(schema), ref.backend_s(schema), split))
            print(f"{name:45s} first chunk {admit:7.3f} {outcome:9s} admission {split[0]:7.3f} "
                  f"raw {_s(rows[-1][3])} backend {_s(rows[-1][4])}  wait/compile/load "
                  + "/".join(f"{x:.3f}" for x in split[1:]), flush=True)
    report_latency(rows, plain)


def _s(x: float | str | None) -> str:
    return f"{'-' if x is None else x:>7}" if not isinstance(x, float) else f"{x:7.3f}"


def report_latency(rows: list, plain: list[float]) -> None:
    both = [r for r in rows if r[2] == "ok" and isinstance(r[3], float)]
    admit = [r[5][0] for r in both]
    first = [r[1] for r in both]
    raw = [r[3] for r in both]
    back = [r[4] for r in both if r[4] is not None]
    within = sum(r[5][0] <= 2 * r[3] + 0.05 for r in both)
    slow = sum(r[3] == "timeout" for r in rows)
    print(f"\n{len(rows)} schemas; {len(both)} admitted by the engine and compiled by raw "
          f"xgrammar ({slow} raw compiles cut at the raw timeout, left out); unconstrained "
          f"first chunk p50 {pct(plain, .5) * 1e3:.0f} ms")
    for label, xs in (("engine: first chunk", first),
                      ("engine: admission (submit to grammar ready)", admit),
                      ("raw xgrammar compile", raw),
                      ("backend compile (normalize + compile)", back)):
        print(f"  {label:44s} p50 {pct(xs, .5) * 1e3:8.1f} ms   p99 {pct(xs, .99) * 1e3:8.1f} ms")
    for i, stage in enumerate(("queue wait", "compile in a worker", "load in the scheduler")):
        xs = [r[5][i + 1] for r in both]
        print(f"  {'  admission: ' + stage:44s} p50 {pct(xs, .5) * 1e3:8.1f} ms   "
              f"p99 {pct(xs, .99) * 1e3:8.1f} ms")
    print(f"  p50 admission / (2 x raw + 50 ms): "
          f"{pct(admit, .5) / (2 * pct(raw, .5) + .05):.2f}; per schema within 2 x raw + 50 ms: "
          f"{within}/{len(both)}; p50 admission / (2 x backend + 50 ms): "
          f"{pct(admit, .5) / (2 * pct(back, .5) + .05):.2f}")
    others = [(r[0], r[2]) for r in rows if r[2] != "ok"]
    if others:
        print(f"  refused by the engine: {others}")


def burst(args: argparse.Namespace) -> None:
    from sgdsl.runtime import Engine

    suite = list(schemas(None).items())[:args.burst]
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            peak[0] = max(peak[0], tree_rss(os.getpid()))

    async def one(eng, schema: dict) -> tuple[float, str]:
        t0 = time.perf_counter()
        try:
            stream = await eng.async_generate(PROMPT, {"json_schema": json.dumps(schema),
                                                       "max_new_tokens": MAX_NEW}, stream=True)
            try:
                await stream.__anext__()
            finally:
                await stream.aclose()
            return time.perf_counter() - t0, "ok"
        except Exception as e:  # noqa: BLE001 - counted by type
            return time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:80]}"

    empty_disk_cache()
    with Engine() as eng:
        threading.Thread(target=watch, daemon=True).start()
        t0 = time.perf_counter()

        async def go():
            return await asyncio.gather(*(one(eng, s) for _, s in suite))
        results = asyncio.run(go())
        wall = time.perf_counter() - t0
        stats = eng.stats()
        stop.set()
    ok = [t for t, o in results if o == "ok"]
    refused: dict[str, int] = {}
    for _, o in results:
        if o != "ok":
            refused[o] = refused.get(o, 0) + 1
    print(f"\nburst: {len(suite)} distinct schemas at once, {stats['grammar_compile_workers']} "
          f"compile workers: {len(ok)} admitted in {wall:.1f} s; first chunk p50 "
          f"{pct(ok, .5):.2f} s p99 {pct(ok, .99):.2f} s; peak RSS {peak[0] / 2**30:.2f} GiB")
    for reason, n in sorted(refused.items(), key=lambda kv: -kv[1]):
        print(f"  refused {n}: {reason}")


def empty_disk_cache() -> None:
    """Compiles are measured: each engine's on-disk grammar cache starts empty (a first start)."""
    import tempfile

    os.environ["SGDSL_GRAMMAR_CACHE_DIR"] = tempfile.mkdtemp(prefix="sgdsl-bench-grammars-")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("parts", nargs="*", default=["latency", "burst"])
    ap.add_argument("--limit", type=int, default=None, help="latency: first N schemas")
    ap.add_argument("--stride", type=int, default=1, help="latency: every Nth schema")
    ap.add_argument("--burst", type=int, default=150)
    ap.add_argument("--raw-timeout", type=float, default=10.0,
                    help="latency: raw xgrammar compiles cut after this many seconds")
    args = ap.parse_args()
    if "latency" in args.parts:
        latency(args)
    if "burst" in args.parts:
        burst(args)


if __name__ == "__main__":
    main()

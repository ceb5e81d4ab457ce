"""Per-schema stages of an xgrammar compile over the real-world suite, in one helper process:
raw xgrammar on the raw schema (the peer), the normalizer, xgrammar on the normalized schema,
and the transfer of the compiled grammar (``serialize_json`` in the worker, ``deserialize_json``
in the engine) against compiling it a second time. Also, per normalization choice, the compile
of the schema with that choice undone (``--ablate``), to find which one makes a schema slower.

    python benchmarks/bench_compile_stages.py [--stride 3] [--limit N] [--ablate]

Each schema runs in a spawned helper cut at ``--timeout`` seconds (some raw compiles take a
minute); a cut or refused stage prints ``-``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "schemas" / "realworld"
MAX_NEW = 256
_STATE: dict = {}


def _init() -> None:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from sgdsl.runtime.grammar import create_grammar_backend
    from sgdsl.runtime.grammar.compile.vacuous_bounds import longest_token_bytes
    from sgdsl.runtime.model.embedded import embedded_model_path

    tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=49152, stop_token_ids=[2])
    _STATE.update(xgr=xgr, info=info, reach=MAX_NEW * longest_token_bytes(tok),
                  compiler=xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False),
                  backend=create_grammar_backend("xgrammar", tok, 49152))


def _timed(fn, *args):
    t0 = time.perf_counter()
    try:
        out = fn(*args)
    except Exception:  # noqa: BLE001 - a refusal: the stage prints "-"
        return None, None
    return time.perf_counter() - t0, out


def _compile(text: str):
    return _STATE["compiler"].compile_json_schema(text, any_whitespace=False)


def stages(raw: str) -> dict:
    """Seconds of each stage for one schema (None: refused)."""
    from sgdsl.runtime.grammar.compile.vacuous_bounds import drop_vacuous_bounds
    from sgdsl.runtime.grammar.schema import normalize_schema

    key = drop_vacuous_bounds(raw, 100_000, _STATE["reach"])
    row = {"raw": _timed(_compile, raw)[0]}
    row["normalize"], norm = _timed(lambda: json.dumps(normalize_schema(json.loads(key))))
    if norm is None:
        return row
    row["compile"], grammar = _timed(_compile, norm)
    if grammar is None:
        return row
    row["bytes"] = grammar.memory_size_bytes
    row["serialize"], text = _timed(grammar.serialize_json)
    row["json_bytes"] = len(text)
    row["deserialize"], _ = _timed(_STATE["xgr"].CompiledGrammar.deserialize_json, text,
                                   _STATE["info"])
    return row


def ablate(raw: str) -> dict:
    """Compile seconds of the normalized schema with one choice of the normal form undone."""
    from sgdsl.runtime.grammar.compile.vacuous_bounds import drop_vacuous_bounds
    from sgdsl.runtime.grammar.schema import normalizer, tuning

    key = json.loads(drop_vacuous_bounds(raw, 100_000, _STATE["reach"]))
    out = {}
    variants = {"as is": {}, "no fast strings": {"_fast_strings": lambda n: n},
                "no pattern sharing": {"share_patterns": lambda n: n}}
    for name, patch in variants.items():
        saved = {k: getattr(tuning, k) for k in patch}
        for k, v in patch.items():
            setattr(tuning, k, v)
        try:
            _, norm = _timed(lambda: json.dumps(normalizer.normalize_schema(key)))
            out[name] = None if norm is None else _timed(_compile, norm)[0]
        finally:
            for k, v in saved.items():
                setattr(tuning, k, v)
    return out


def _ready() -> bool:
    return True


class Helper:
    """One spawned process; a job past its timeout gets the process replaced (whose start-up,
    slow on a loaded box, is waited for apart: it is not the job's time)."""

    def __init__(self) -> None:
        self.pool = self._start()

    @staticmethod
    def _start():
        pool = mp.get_context("spawn").Pool(1, initializer=_init)
        pool.apply(_ready)
        return pool

    def run(self, fn, text: str, timeout: float) -> dict | None:
        job = self.pool.apply_async(fn, (text,))
        try:
            return job.get(timeout)
        except mp.TimeoutError:
            self.pool.terminate()
            self.pool = self._start()
            return None


def _ms(x) -> str:
    return f"{x * 1e3:9.1f}" if isinstance(x, float) else f"{'-':>9}"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--ablate", action="store_true")
    args = ap.parse_args()
    names = sorted(DATA.glob("*.json"))[:args.limit][::args.stride]
    helper = Helper()
    rows = {}
    cols = ("raw", "normalize", "compile", "serialize", "deserialize")
    print(f"{'schema':40s}" + "".join(f"{c:>12s}" for c in cols) + "   grammar MB  json MB"
          + ("   ablations (compile ms)" if args.ablate else ""))
    for path in names:
        text = path.read_text()
        row = helper.run(stages, text, args.timeout) or {}
        rows[path.stem] = row
        line = f"{path.stem:40s}" + "".join(f"{_ms(row.get(c)):>12s}" for c in cols)
        line += f"   {row.get('bytes', 0) / 1e6:9.2f} {row.get('json_bytes', 0) / 1e6:8.2f}"
        if args.ablate:
            abl = helper.run(ablate, text, args.timeout) or {}
            line += "   " + " ".join(f"{k}={_ms(v).strip()}" for k, v in abl.items())
        print(line, flush=True)
    full = [r for r in rows.values() if all(isinstance(r.get(c), float) for c in cols)]
    print(f"\n{len(full)} of {len(rows)} schemas with every stage; p50 / p99 ms:")
    for c in cols:
        xs = [r[c] for r in full]
        print(f"  {c:12s} {pct(xs, .5) * 1e3:9.1f} {pct(xs, .99) * 1e3:9.1f}")
    ratio = [(r["serialize"] + r["deserialize"]) / r["compile"] for r in full]
    wins = sum(x < 1 for x in ratio)
    print(f"  (serialize + deserialize) / compile: p50 {pct(ratio, .5):.2f}; transfer cheaper "
          f"than a second compile on {wins} of {len(full)}")
    slow = [(r["compile"] / r["raw"], n) for n, r in rows.items()
            if isinstance(r.get("raw"), float) and isinstance(r.get("compile"), float)]
    print(f"  normalized / raw compile: p50 {pct([s for s, _ in slow], .5):.2f}; slowest: "
          + ", ".join(f"{n} {s:.1f}x" for s, n in sorted(slow)[-5:]))


if __name__ == "__main__":
    main()

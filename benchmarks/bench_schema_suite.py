"""Schema-suite benchmark: admission, compile time and output validity of real JSON schemas.

Per backend, over the schemas in ``tests/data/schemas/realworld`` (and/or the synthetic
``json`` suite): how many are admitted (limits, normalizer, compile within the deadline) versus
what xgrammar alone compiles from the raw schema, compile time p50/p99, and every rejection's
reason. With ``--generate`` every admitted schema is also sent at once to one Engine (embedded
model) and the outputs are counted: valid, invalid (caught by the runtime's output check: an
error, never a success), cut at max_new_tokens. Usage:

    python benchmarks/bench_schema_suite.py [--backend xgrammar|outlines|both]
        [--suite realworld|json|all] [--generate] [--max-new-tokens 384] [--raw]
        [--only NAME ...]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

DATA = Path(__file__).parents[1] / "tests" / "data" / "schemas"


def load(suite: str) -> dict[str, dict]:
    dirs = {"realworld": ["realworld"], "json": ["json"], "all": ["realworld", "json"]}[suite]
    return {p.stem: json.loads(p.read_text())
            for d in dirs for p in sorted((DATA / d).glob("*.json"))}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def raw_xgrammar(tokenizer, schemas: dict, timeout_s: float) -> dict[str, float | None]:
    """Compile seconds of each raw schema by xgrammar alone (no normalizer; None: it refused),
    one at a time; a compile over ``timeout_s`` counts as not admitted by the caller."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=49152, stop_token_ids=[2])
    comp = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    out: dict[str, float | None] = {}
    for name, s in schemas.items():
        t0 = time.perf_counter()
        try:
            comp.compile_json_schema(json.dumps(s), any_whitespace=False)
            out[name] = time.perf_counter() - t0
        except Exception:  # noqa: BLE001 - xgrammar's own rejection
            out[name] = None
    return out


def admit(backend_name: str, tokenizer, schemas: dict, timeout_s: float,
          max_new_tokens: int) -> tuple[dict, dict]:
    """(name -> compile seconds for admitted schemas, name -> rejection message). As the engine
    admits a request of ``max_new_tokens``: bounds it cannot reach dropped first."""
    from sgdsl.runtime.errors import InvalidRequestError
    from sgdsl.runtime.grammar import GrammarCompiler, GrammarKey, create_grammar_backend
    from sgdsl.runtime.grammar.compile.limits import GrammarLimits
    from sgdsl.runtime.grammar.compile.vacuous_bounds import drop_vacuous_bounds, longest_token_bytes

    reach = max_new_tokens * longest_token_bytes(tokenizer)
    limit = GrammarLimits().max_schema_bound

    compiler = GrammarCompiler(create_grammar_backend(backend_name, tokenizer, 49152),
                               timeout_s=timeout_s, max_workers=1)
    times, rejected = {}, {}
    for name, s in schemas.items():
        key = GrammarKey("json_schema", drop_vacuous_bounds(json.dumps(s), limit, reach))
        try:
            compiler.compile(key)
            times[name] = compiler.compile_seconds(key)
        except InvalidRequestError as e:
            rejected[name] = str(e)
    compiler.shutdown()
    return times, rejected


def generate(backend_name: str, schemas: dict, max_new_tokens: int) -> dict:
    from sgdsl.runtime import Engine
    from sgdsl.runtime.errors import ConstraintViolationError, InvalidRequestError

    counts = {"valid": 0, "invalid_caught": 0, "cut": 0, "engine_rejected": 0}
    reasons: dict[str, int] = {}

    async def one(eng, name, s):
        prompt = (f"<|im_start|>user\nGive an example JSON value for '{s.get('title', name)}'."
                  "<|im_end|>\n<|im_start|>assistant\n")
        try:
            res = await eng.async_generate(prompt, {"json_schema": json.dumps(s), "seed": 1,
                                                    "max_new_tokens": max_new_tokens,
                                                    "temperature": 0.7})
        except ConstraintViolationError as e:
            print(f"[{backend_name}] invalid (caught) {name}: {str(e)[:300]}")
            return "invalid_caught"
        except InvalidRequestError as e:
            reason = str(e)[:90]
            reasons[reason] = reasons.get(reason, 0) + 1
            return "engine_rejected"
        if res["meta_info"]["finish_reason"]["type"] == "length":
            print(f"[{backend_name}] cut {name}: ...{res['text'][-120:]!r}")
            return "cut"
        return "valid"

    # NOTE: every schema is compiled at once here, on the engine's 2 compile workers: with the
    # serving deadline (10 s from submission) most would time out waiting in the queue, which
    # is the flood behaviour, not what this counts; admission was measured above.
    with Engine(grammar_backend=backend_name, grammar_compile_timeout_s=600.0) as eng:
        async def go():
            return await asyncio.gather(*(one(eng, n, s) for n, s in schemas.items()))
        t0 = time.perf_counter()
        for outcome in asyncio.run(go()):
            counts[outcome] += 1
        counts["wall_s"] = round(time.perf_counter() - t0, 1)
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"[{backend_name}] engine rejected {n}: {reason}")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="both", choices=["xgrammar", "outlines", "both"])
    ap.add_argument("--suite", default="realworld", choices=["realworld", "json", "all"])
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--raw", action="store_true", help="also count what raw xgrammar compiles")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--verbose", action="store_true", help="print every rejection")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="only these schemas (file names without .json)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from sgdsl.runtime.model.embedded import embedded_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    schemas = load(args.suite)
    if args.only:
        schemas = {n: schemas[n] for n in args.only}
    report: dict = {"suite": args.suite, "schemas": len(schemas)}
    if args.raw:
        raw = raw_xgrammar(tokenizer, schemas, args.timeout)
        secs = [t for t in raw.values() if t is not None and t <= args.timeout]
        report["raw_xgrammar"] = {"admitted": len(secs),
                                  "refused": sum(t is None for t in raw.values()),
                                  "over_deadline": sum(t is not None and t > args.timeout
                                                       for t in raw.values()),
                                  "compile_p50_s": round(pct(secs, 0.5), 3),
                                  "compile_p99_s": round(pct(secs, 0.99), 3)}
    for name in (["xgrammar", "outlines"] if args.backend == "both" else [args.backend]):
        times, rejected = admit(name, tokenizer, schemas, args.timeout, args.max_new_tokens)
        secs = list(times.values())
        row = {"admitted": len(times), "rejected": len(rejected),
               "compile_p50_s": round(pct(secs, 0.5), 3),
               "compile_p99_s": round(pct(secs, 0.99), 3),
               "compile_max_s": round(max(secs, default=0.0), 3)}
        if args.generate:
            row.update(generate(name, {n: schemas[n] for n in times}, args.max_new_tokens))
        report[name] = row
        for n, why in sorted(rejected.items()):
            if args.verbose:
                print(f"[{name}] rejected {n}: {why[:200]}")
        if args.verbose:
            for n, t in sorted(times.items(), key=lambda kv: -kv[1])[:10]:
                print(f"[{name}] slowest {n}: {t:.2f} s")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

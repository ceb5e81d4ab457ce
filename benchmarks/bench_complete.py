"""Forced completion, before/after: the share of constrained outputs cut at max_new_tokens.

Runs the JSON-schema suite of tests/data/schemas (the validity suite's schemas and prompts) on
the embedded model with a small budget, all requests at once to one Engine, twice: with
forced completion off (``disable_forced_completion``: the runtime before) and on (the
default). Prints, per run,
how many outputs finished with a value, were cut at the budget, were invalid, or were rejected
at admission, and the wall time.

    python benchmarks/bench_complete.py [--backend xgrammar] [--max-new-tokens 48] [--every 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import jsonschema

from sgdsl.runtime import Engine
from sgdsl.runtime.errors import ConstraintViolationError, InvalidRequestError

DATA = Path(__file__).parents[1] / "tests" / "data" / "schemas" / "json"


def _prompt(title: str) -> str:
    return (f"<|im_start|>user\nGive an example JSON value for '{title}'.<|im_end|>\n"
            "<|im_start|>assistant\n")


async def _one(engine: Engine, schema: dict, max_new_tokens: int) -> str:
    params = {"json_schema": json.dumps(schema), "max_new_tokens": max_new_tokens,
              "temperature": 0}
    try:
        out = await engine.async_generate(_prompt(schema.get("title", "")), params)
    except ConstraintViolationError as e:  # the runtime's backstop caught an invalid output
        print(f"  invalid: {schema.get('title')}: {str(e)[:200]}", flush=True)
        return "invalid"
    except InvalidRequestError:
        return "rejected"
    if out["meta_info"]["finish_reason"]["type"] == "length":
        print(f"  cut: {schema.get('title')}: {out['text'][-60:]!r}", flush=True)
        return "cut"
    try:
        jsonschema.validate(json.loads(out["text"]), schema)
    except (ValueError, jsonschema.ValidationError):
        return "invalid"
    return "valid"


def run(backend: str, force: bool, max_new_tokens: int, schemas: list[dict]) -> dict:
    with Engine(grammar_backend=backend, disable_forced_completion=not force,
                grammar_compile_timeout_s=120.0) as engine:
        t0 = time.perf_counter()

        async def go() -> list[str]:
            return await asyncio.gather(*(_one(engine, s, max_new_tokens) for s in schemas))
        kinds = asyncio.run(go())
        wall = time.perf_counter() - t0
        stats = engine.stats()
    counts = {k: kinds.count(k) for k in ("valid", "cut", "invalid", "rejected")}
    admitted = len(schemas) - counts["rejected"]
    return {**counts, "admitted": admitted, "wall_s": round(wall, 1),
            "cut_share": round(counts["cut"] / max(admitted, 1), 3),
            "forced": stats.get("grammar_forced_completions", 0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="xgrammar", choices=["xgrammar", "outlines"])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--every", type=int, default=1, help="take every k-th schema of the suite")
    ap.add_argument("--force-only", action="store_true", help="only the forced-completion run")
    args = ap.parse_args()
    schemas = [json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))][::args.every]
    print(f"{len(schemas)} schemas, backend {args.backend}, max_new_tokens "
          f"{args.max_new_tokens}, embedded SmolLM2-135M, temperature 0")
    ap_modes = (True,) if args.force_only else (False, True)
    for force in ap_modes:
        res = run(args.backend, force, args.max_new_tokens, schemas)
        print(f"force_completion={force}: " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()

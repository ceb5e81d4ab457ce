"""Forced completion, before/after: the share of constrained outputs cut at max_new_tokens.

Runs the JSON-schema suite of tests/data/schemas (the validity suite's schemas and prompts) on
the embedded model with a small budget, all requests at once to one Engine, twice: with
forced completion off (``disable_forced_completion``: the runtime before) and on (the
default). Prints, per run,
how many outputs finished with a value, were cut at the budget, were invalid, or were rejected
at admission, and the wall time.

    python benchmarks/bench_complete.py [--backend xgrammar] [--max-new-tokens 48]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import jsonschema

from sgdsl.runtime import Engine
from sgdsl.runtime.errors import InvalidRequestError

DATA = Path(__file__).parents[1] / "tests" / "data" / "schemas" / "json"


def _prompt(title: str) -> str:
    return (f"<|im_start|>user\nGive an example JSON value for '{title}'.<|im_end|>\n"
            "<|im_start|>assistant\n")


async def _one(engine: Engine, schema: dict, max_new_tokens: int) -> str:
    params = {"json_schema": json.dumps(schema), "max_new_tokens": max_new_tokens,
              "temperature": 0}
    try:
        out = await engine.async_generate(_prompt(schema.get("title", "")), params)
    except InvalidRequestError:
        return "rejected"
    if out["meta_info"]["finish_reason"]["type"] == "length":
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
    args = ap.parse_args()
    schemas = [json.loads(p.read_text()) for p in sorted(DATA.glob("*.json"))]
    print(f"{len(schemas)} schemas, backend {args.backend}, max_new_tokens "
          f"{args.max_new_tokens}, embedded SmolLM2-135M, temperature 0")
    for force in (False, True):
        res = run(args.backend, force, args.max_new_tokens, schemas)
        print(f"force_completion={force}: " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()

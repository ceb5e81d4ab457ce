"""DSL overhead: ``run_batch`` of N small programs on the ``Local`` backend vs the same
requests sent straight to the ``Engine`` as one batch, in one process on one engine.

Both sides generate exactly ``--max-tokens`` tokens per prompt (``ignore_eos``, greedy) from
the same prompts; the prefix cache is flushed before every timed pass so neither side reuses
the other's prefill. Passes alternate (engine, dsl, engine, dsl...) and the best of each is
kept. Prints one JSON line with both times and ``ratio`` = dsl / engine (target <= 1.05).

    python benchmarks/bench_dsl_overhead.py                      # embedded model, CPU
    python benchmarks/bench_dsl_overhead.py --model CONFIG_DIR --load-format dummy  # GPU
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import sgdsl as sgl
from sgdsl.backends import Local
from sgdsl.runtime import Engine

TOPICS = ["rivers", "stars", "bread", "trains", "music", "chess", "rain", "maps"]


@sgl.function
def small_program(s, prompt: str, max_tokens: int):
    s += prompt
    s += sgl.gen("out", max_tokens=max_tokens, ignore_eos=True, temperature=0.0)


def prompts(n: int) -> list[str]:
    return [f"Fact {i}: a short sentence about {TOPICS[i % len(TOPICS)]} is" for i in range(n)]


def time_engine(engine: Engine, texts: list[str], max_tokens: int) -> float:
    params = {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
    engine.flush_cache()
    start = time.perf_counter()
    outs = engine.generate(texts, params)
    elapsed = time.perf_counter() - start
    assert all(o["meta_info"]["completion_tokens"] == max_tokens for o in outs)
    return elapsed


def time_dsl(backend: Local, texts: list[str], max_tokens: int) -> float:
    batch = [{"prompt": t, "max_tokens": max_tokens} for t in texts]
    backend.flush_cache()
    start = time.perf_counter()
    states = small_program.run_batch(batch, backend=backend, max_concurrency=len(batch))
    elapsed = time.perf_counter() - start
    for state in states:
        if state.error() is not None:
            raise state.error()
        assert state.get_meta_info("out")["completion_tokens"] == max_tokens
    return elapsed


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--passes", type=int, default=2, help="timed passes per side")
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--load-format", default="auto")
    args = parser.parse_args(argv)
    engine = Engine(model=args.model, load_format=args.load_format)
    try:
        backend = Local(engine=engine)
        texts = prompts(args.num)
        time_engine(engine, texts[:8], 2)  # warm-up: first-call costs stay out of both sides
        time_dsl(backend, texts[:8], 2)
        engine_s, dsl_s = [], []
        for _ in range(args.passes):
            engine_s.append(time_engine(engine, texts, args.max_tokens))
            dsl_s.append(time_dsl(backend, texts, args.max_tokens))
        result = {"bench": "dsl_overhead", "programs": args.num, "max_tokens": args.max_tokens,
                  "engine_s": round(min(engine_s), 4), "dsl_s": round(min(dsl_s), 4),
                  "ratio": round(min(dsl_s) / min(engine_s), 4)}
        print(json.dumps(result))
        return result
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()

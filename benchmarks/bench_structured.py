"""Structured-generation benchmark: one JSON-extraction workload run three ways in one process:
unconstrained, grammar mask only, and mask + jump-forward; plus offline grammar measurements.

Reports per mode: wall time, completion tokens, tokens/s, forward steps, the share of tokens
appended by jump-forward (engine stats), and validity of the outputs. Offline (in-process, same
backend): mask fill time per token p50/p99 replaying the constrained outputs, and compile time
cold and cached. Usage:

    python benchmarks/bench_structured.py [--backend xgrammar|outlines] [--requests 16]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
        "occupation": {"enum": ["engineer", "teacher", "doctor", "artist", "farmer", "other"]},
        "is_employed": {"type": "boolean"},
        "contact": {"type": "object", "properties": {
            "email_provided": {"type": "boolean"}, "phone_provided": {"type": "boolean"}},
            "required": ["email_provided", "phone_provided"]},
    },
    "required": ["name", "age", "city", "occupation", "is_employed", "contact"],
}
PEOPLE = [("Alice Smith", 34, "Paris", "engineer"), ("Bob Jones", 51, "Austin", "teacher"),
          ("Chen Wei", 28, "Shanghai", "doctor"), ("Dana Lee", 45, "Seoul", "artist"),
          ("Emil Novak", 62, "Prague", "farmer"), ("Fatima Zahra", 39, "Rabat", "engineer"),
          ("Gus Berg", 23, "Oslo", "teacher"), ("Hana Sato", 31, "Osaka", "doctor")]


def prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        name, age, city, job = PEOPLE[i % len(PEOPLE)]
        text = f"{name} is {age + i // len(PEOPLE)} years old, lives in {city} and works as a {job}."
        out.append(f"<|im_start|>user\nExtract the person's details as JSON: {text}<|im_end|>\n"
                   "<|im_start|>assistant\n")
    return out


def run_mode(engine, ps: list[str], params: dict) -> dict:
    engine.flush_cache()
    before = engine.stats()
    t0 = time.perf_counter()
    outs = engine.generate(ps, params)
    wall = time.perf_counter() - t0
    after = engine.stats()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    jumped = after.get("grammar_jump_forward_tokens", 0) - before.get("grammar_jump_forward_tokens", 0)
    valid = 0
    for o in outs:
        try:
            json.loads(o["text"])
            valid += 1
        except ValueError:
            pass
    return {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall,
            "steps": after["forward_steps"] - before["forward_steps"],
            "jump_share": jumped / tokens if tokens else 0.0, "json_ok": valid, "outs": outs}


def offline(backend_name: str, outs: list[dict]) -> dict:
    """Mask fill time per token replaying the outputs; compile time cold vs cached."""
    import torch  # noqa: F401  (backends need it)
    from transformers import AutoTokenizer

    from sgdsl.runtime.grammar import (GrammarCompiler, GrammarKey, allocate_bitmask,
                                       create_grammar_backend)
    from sgdsl.runtime.model.embedded import embedded_model_path

    tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    backend = create_grammar_backend(backend_name, tok, 49152)
    compiler = GrammarCompiler(backend, timeout_s=300)
    key = GrammarKey.from_constraint("json_schema", SCHEMA)
    t0 = time.perf_counter()
    compiler.compile(key)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiler.compile(key)
    cached = time.perf_counter() - t0
    fills = []
    row = allocate_bitmask(1, 49152)
    for o in outs:
        g = compiler.compile(key)
        for t in o["output_ids"]:
            t0 = time.perf_counter()
            g.fill_bitmask(row, 0)
            fills.append(time.perf_counter() - t0)
            if not g.accept_token(t):
                break
    fills.sort()
    return {"compile_cold_s": cold, "compile_cached_s": cached,
            "mask_p50_us": 1e6 * fills[len(fills) // 2],
            "mask_p99_us": 1e6 * fills[min(len(fills) - 1, int(len(fills) * 0.99))],
            "mask_mean_us": 1e6 * statistics.fmean(fills), "mask_samples": len(fills)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="xgrammar", choices=["xgrammar", "outlines"])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    from sgdsl.runtime import Engine

    ps = prompts(args.requests)
    constrained = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": args.max_tokens,
                   "temperature": 0}
    # Unconstrained: same prompts and budget; the model free-writes (often past the JSON).
    plain = {"max_new_tokens": args.max_tokens, "temperature": 0}
    results = {}
    for jump in (False, True):
        with Engine(grammar_backend=args.backend, disable_jump_forward=not jump) as engine:
            # warm-up: compile, and the first forwards at this batch (each engine is a fresh
            # process: a 2-prompt warm-up left the jump-forward engine's 16-prompt prefill cold)
            run_mode(engine, ps, constrained)
            if not jump:
                results["unconstrained"] = run_mode(engine, ps, plain)
                results["mask-only"] = run_mode(engine, ps, constrained)
            else:
                results["mask+jump-forward"] = run_mode(engine, ps, constrained)
    base = results["unconstrained"]["tok_s"]
    print(f"backend={args.backend} requests={args.requests} max_new_tokens={args.max_tokens}")
    print("| mode | wall s | completion tokens | tokens/s | vs unconstrained | forward steps "
          "| jump-forward share | JSON parses |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['wall_s']:.1f} | {r['tokens']} | {r['tok_s']:.1f} | "
              f"{r['tok_s'] / base:.2f}x | {r['steps']} | {100 * r['jump_share']:.0f}% | "
              f"{r['json_ok']}/{args.requests} |")
    off = offline(args.backend, results["mask-only"]["outs"])
    print(f"mask fill per token: p50 {off['mask_p50_us']:.0f} us, p99 {off['mask_p99_us']:.0f} us "
          f"(mean {off['mask_mean_us']:.0f} us, {off['mask_samples']} tokens); compile: cold "
          f"{1e3 * off['compile_cold_s']:.1f} ms, cached {1e3 * off['compile_cached_s']:.3f} ms")


if __name__ == "__main__":
    main()

"""Grammar compile flood (issue 15, item 4): decode speed of an unconstrained stream while the
server is flooded with slow, distinct grammars, against the same stream on the idle server; plus
the cost of compiling in worker processes (transfer) against compiling in-process.

flood:    ``python -m sgdsl.runtime.server`` (embedded model) with the given backend; an
          unconstrained stream (ignore_eos) measured idle, then while ``--flood`` slow regexes
          are in flight; repeated ``--rounds`` times. Reports decode tok/s (first to last
          token), the flood's answers (status, reason) and latency, and the peak RSS of the
          whole server tree (server, scheduler, compile workers).
transfer: over the schema suite (tests/data/schemas/json), per backend: compile in-process vs
          submit-to-result through a worker (compile + serialize + pipe + deserialize).

    python benchmarks/bench_grammar_flood.py flood --backend outlines
    python benchmarks/bench_grammar_flood.py transfer
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench_serving import launch
from proc_stats import tree_rss

SLOW = {"outlines": '[^"]{0,%d}', "xgrammar": '[^"]{0,%d}'}
FIRST_BOUND = {"outlines": 90, "xgrammar": 700}
ROOT = Path(__file__).resolve().parents[1]


def stream_tok_s(url: str, max_new_tokens: int) -> float:
    """Decode tokens/s of one unconstrained stream, first token to last."""
    body = {"text": "Write a long story about a lighthouse.", "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True,
                                "temperature": 0}}
    stamps, tokens = [], 0
    with httpx.Client(timeout=600) as client, client.stream("POST", url + "/generate",
                                                           json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
                tokens = json.loads(line[6:])["meta_info"]["completion_tokens"]
    return (tokens - 1) / (stamps[-1] - stamps[0])


def flood(args: argparse.Namespace) -> None:
    proc, url = launch(["--grammar-backend", args.backend, "--num-threads", "1",
                        "--grammar-compile-timeout-s", str(args.timeout_s),
                        "--grammar-compile-memory-bytes", str(args.memory_bytes)])
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.1):
            peak[0] = max(peak[0], tree_rss(proc.pid))
    threading.Thread(target=watch, daemon=True).start()

    def constrained(regex: str) -> tuple[int, str, float]:
        t0 = time.perf_counter()
        r = httpx.post(url + "/generate", timeout=600, json={
            "text": "Say:", "sampling_params": {"regex": regex, "max_new_tokens": 4}})
        reason = r.json().get("error", {}).get("message", "")[:90] if r.status_code != 200 else ""
        return r.status_code, reason, time.perf_counter() - t0
    try:
        constrained("(yes|no)")  # starts the compile workers
        stream_tok_s(url, 16)
        idle, busy, answers = [], [], []
        bound = FIRST_BOUND[args.backend]
        for _ in range(args.rounds):
            idle.append(stream_tok_s(url, args.tokens))
            regexes = [SLOW[args.backend] % (bound + i) for i in range(args.flood)]
            bound += args.flood
            with ThreadPoolExecutor(args.flood) as pool:
                futures = [pool.submit(constrained, r) for r in regexes]
                time.sleep(0.5)
                busy.append(stream_tok_s(url, args.tokens))
                answers += [f.result() for f in futures]
        report(args, idle, busy, answers, peak[0])
    finally:
        stop.set()
        proc.terminate()
        proc.wait(60)


def report(args: argparse.Namespace, idle: list[float], busy: list[float],
           answers: list[tuple[int, str, float]], peak: int) -> None:
    i, b = statistics.median(idle), statistics.median(busy)
    print(f"\nbackend {args.backend}, {args.rounds} rounds of {args.flood} slow regexes, "
          f"deadline {args.timeout_s} s, memory {args.memory_bytes >> 20} MiB per compile")
    print(f"decode tok/s idle {i:.1f} (runs {[round(x, 1) for x in idle]}), during flood "
          f"{b:.1f} (runs {[round(x, 1) for x in busy]}): ratio {b / i:.2f}")
    lat = sorted(a[2] for a in answers)
    print(f"flood answers: {len(answers)}; latency p50 {lat[len(lat) // 2]:.1f} s, "
          f"max {lat[-1]:.1f} s; peak server-tree RSS {peak / 2**30:.2f} GiB")
    reasons: dict[str, int] = {}
    for status, reason, _ in answers:
        key = f"{status} {reason.split('(')[0].split(' the ')[0] if reason else 'ok'}"
        reasons[key] = reasons.get(key, 0) + 1
    for key, n in sorted(reasons.items()):
        print(f"  {n:3d} x {key}")


def transfer(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from sgdsl.runtime.errors import InvalidRequestError
    from sgdsl.runtime.grammar import GrammarCompiler, GrammarKey, create_grammar_backend
    from sgdsl.runtime.model.embedded import embedded_model_path

    tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    texts = [p.read_text() for p in sorted((ROOT / "tests/data/schemas/json").glob("*.json"))]
    for name in ("xgrammar", "outlines"):
        backend = create_grammar_backend(name, tok, len(tok))
        compiler = GrammarCompiler(backend, timeout_s=120, cache_size=0)
        compiler.compile(GrammarKey("regex", "warm"))
        local, remote, sizes = [], [], []
        for text in texts[: args.schemas]:
            key = GrammarKey("json_schema", text)
            try:
                t0 = time.perf_counter()
                sizes.append(len(backend.serialize(backend.compile(key))))
                local.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                compiler.compile(key)
                remote.append(time.perf_counter() - t0)
            except InvalidRequestError:
                continue
        compiler.shutdown()
        q = lambda v, p: sorted(v)[int(p * (len(v) - 1))] * 1e3  # noqa: E731
        print(f"{name}: {len(local)} schemas; in-process compile p50 {q(local, .5):.1f} ms "
              f"p99 {q(local, .99):.1f} ms; through a worker p50 {q(remote, .5):.1f} ms p99 "
              f"{q(remote, .99):.1f} ms; serialized p50 {q(sizes, .5) / 1e6:.0f} KB "
              f"max {max(sizes) / 1e6:.1f} MB")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["flood", "transfer"])
    parser.add_argument("--backend", choices=sorted(SLOW), default="outlines")
    parser.add_argument("--flood", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--memory-bytes", type=int, default=1 << 30)
    parser.add_argument("--schemas", type=int, default=1000)
    args = parser.parse_args(argv)
    (flood if args.mode == "flood" else transfer)(args)


if __name__ == "__main__":
    sys.exit(main())

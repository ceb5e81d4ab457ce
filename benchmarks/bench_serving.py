"""Serving benchmark: a concurrency sweep against a running server (or one it starts).

For each concurrency level, ``--num-requests`` streaming requests with synthetic prompts and a
fixed output length (``ignore_eos``) run with at most that many in flight. Reported per level:
request and output-token throughput, time to first token (TTFT) and inter-token latency (ITL)
percentiles. ``--peer-url`` runs the same sweep against another OpenAI-compatible server
(SGLang, vLLM...) and prints our/peer ratios.

    python benchmarks/bench_serving.py --launch --concurrency 1,4,16 --num-requests 32
    python benchmarks/bench_serving.py --url http://127.0.0.1:30000 --protocol openai
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

WORDS = ("time person year way day thing man world life hand part child eye woman place work "
         "week case point government company number group problem fact").split()


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    output_tokens: int = 0
    itls_s: list[float] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class Target:
    url: str
    protocol: str  # "native" (/generate) or "openai" (/v1/completions)
    model: str
    api_key: str | None


def percentiles(values: list[float]) -> tuple[float, float, float]:
    if not values:
        return (float("nan"),) * 3
    qs = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return qs[49], qs[89], qs[98]


def make_prompts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def _request(target: Target, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    if target.protocol == "native":
        return "/generate", {"text": prompt, "stream": True, "sampling_params": {
            "max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    return "/v1/completions", {"model": target.model, "prompt": prompt, "max_tokens": max_tokens,
                               "temperature": 0, "stream": True, "ignore_eos": True,
                               "stream_options": {"include_usage": True}}


def _tokens_in(target: Target, event: dict[str, Any], seen: int) -> int:
    """Output tokens so far according to one SSE event."""
    if target.protocol == "native":
        return len(event.get("output_ids", ()))
    if event.get("usage"):
        return event["usage"]["completion_tokens"]
    return seen + (1 if event.get("choices") and event["choices"][0].get("text") else 0)


async def one_request(client: httpx.AsyncClient, target: Target, prompt: str,
                      max_tokens: int) -> RequestResult:
    path, body = _request(target, prompt, max_tokens)
    start = last = time.perf_counter()
    res = RequestResult(ok=False)
    try:
        async with client.stream("POST", target.url + path, json=body) as resp:
            if resp.status_code != 200:
                return RequestResult(ok=False, error=f"HTTP {resp.status_code}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                count = _tokens_in(target, json.loads(line[6:]), res.output_tokens)
                now = time.perf_counter()
                if count > res.output_tokens:
                    if res.output_tokens == 0:
                        res.ttft_s = now - start
                    else:
                        res.itls_s.extend([(now - last) / (count - res.output_tokens)]
                                          * (count - res.output_tokens))
                    res.output_tokens, last = count, now
    except httpx.HTTPError as exc:
        return RequestResult(ok=False, error=repr(exc))
    res.latency_s = time.perf_counter() - start
    res.ok = res.output_tokens > 0
    return res


async def run_level(target: Target, prompts: list[str], concurrency: int,
                    max_tokens: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=3600, headers=headers, limits=limits) as client:

        async def guarded(prompt: str) -> RequestResult:
            async with sem:
                return await one_request(client, target, prompt, max_tokens)

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(p) for p in prompts))
        duration = time.perf_counter() - start
    return summarize(results, duration, concurrency)


def summarize(results: list[RequestResult], duration: float, concurrency: int) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    ttft = percentiles([r.ttft_s * 1000 for r in ok])
    itl = percentiles([x * 1000 for r in ok for x in r.itls_s])
    return {"concurrency": concurrency, "requests": len(results), "failed": len(results) - len(ok),
            "duration_s": duration, "req_per_s": len(ok) / duration,
            "out_tok_per_s": tokens / duration, "ttft_ms": ttft, "itl_ms": itl,
            "errors": sorted({r.error for r in results if r.error})[:3]}


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n## {title}")
    print("| conc | reqs | fail | dur s | req/s | out tok/s | TTFT p50/p90/p99 ms "
          "| ITL p50/p90/p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ttft = "/".join(f"{v:.0f}" for v in r["ttft_ms"])
        itl = "/".join(f"{v:.1f}" for v in r["itl_ms"])
        print(f"| {r['concurrency']} | {r['requests']} | {r['failed']} | {r['duration_s']:.1f} "
              f"| {r['req_per_s']:.2f} | {r['out_tok_per_s']:.1f} | {ttft} | {itl} |")
        for err in r["errors"]:
            print(f"  error: {err}")


def launch(extra: list[str]) -> tuple[subprocess.Popen, str]:
    """Start ``python -m sgdsl.runtime.server`` on a free port; return it and its URL."""
    cmd = [sys.executable, "-m", "sgdsl.runtime.server", "--port", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        if "listening on" in line:
            # keep reading its output, so a full pipe never blocks the server
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, line.split("listening on ")[1].split()[0]
    raise SystemExit("server failed to start")


async def sweep(target: Target, args: argparse.Namespace) -> list[dict[str, Any]]:
    prompts = make_prompts(args.num_requests, args.input_words, args.seed)
    await run_level(target, prompts[:2], 1, 2)  # warm-up (first-call costs, caches)
    return [await run_level(target, prompts, c, args.max_tokens) for c in args.concurrency]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", help="a running server; default: --launch one")
    p.add_argument("--launch", action="store_true", help="start sgdsl's server for the run")
    p.add_argument("--server-args", default="", help="extra flags for the launched server")
    p.add_argument("--protocol", choices=["native", "openai"], default="native")
    p.add_argument("--model", default="default", help="model name sent with openai requests")
    p.add_argument("--api-key", default=None)
    p.add_argument("--peer-url", help="an OpenAI-compatible peer server to compare with")
    p.add_argument("--peer-model", default="default")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 4, 16])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--input-words", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        proc, url = launch(args.server_args.split())
    try:
        ours = asyncio.run(sweep(Target(url, args.protocol, args.model, args.api_key), args))
        print_table(f"sgdsl ({args.protocol}, {url})", ours)
        report: dict[str, Any] = {"ours": ours}
        if args.peer_url:
            peer = asyncio.run(sweep(Target(args.peer_url, "openai", args.peer_model,
                                            args.api_key), args))
            print_table(f"peer ({args.peer_url})", peer)
            print("\n| conc | throughput ratio (ours/peer) | TTFT p50 ratio (peer/ours) |")
            print("|---|---|---|")
            for a, b in zip(ours, peer):
                print(f"| {a['concurrency']} | {a['out_tok_per_s'] / b['out_tok_per_s']:.2f} "
                      f"| {b['ttft_ms'][0] / a['ttft_ms'][0]:.2f} |")
            report["peer"] = peer
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)


if __name__ == "__main__":
    main()

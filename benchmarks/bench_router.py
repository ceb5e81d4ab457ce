"""Router benchmark: cost_aware vs round_robin vs cache_aware (or any policies) over the same
replicas, on SGLang's generated-shared-prefix workload, in one run.

The workload: ``--groups`` groups of ``--prompts-per-group`` prompts; every prompt of a group
starts with the group's long system prompt (``--system-prompt-len`` tokens) and ends with its
own question (``--question-len`` tokens); each answer is ``--output-len`` tokens (ignore_eos).
Prompts arrive shuffled, at most ``--concurrency`` in flight. For each policy a fresh router
(an ``sgdsl router`` process) fronts the same replicas, whose prefix caches are flushed first. Reported:
total and output token throughput, and the prefix-cache hit rate summed over the replicas
(hit tokens / prompt tokens, from the replicas' /metrics counters), the balance (most / fewest
requests a replica served) and each policy's throughput over round_robin's; ``--baseline`` adds
the same workload on one replica alone (its hit rate is the ceiling routing can reach).

``--client-procs N`` splits the prompts and the concurrency over N client processes (one
asyncio+httpx process at 256 in flight spends most of a core: it capped the GPU runs).

A policy may carry router options: ``cost_aware:decode_token_weight=4+evict_weight=0`` runs
``sgdsl router --policy cost_aware --decode-token-weight 4 --evict-weight 0`` (so variants
compare in one run). benchmarks/gpu/run_router_suite.sh runs issue 30's three workloads.

    # CPU, tiny random model, 2 replicas started here:
    python benchmarks/bench_router.py --tiny --dp 2 --groups 8 --prompts-per-group 8 \
        --system-prompt-len 192 --question-len 16 --output-len 8 --concurrency 8
    # GPU, 2 replicas of a Llama-3.1-8B shape (one per GPU), SGLang's shape:
    python benchmarks/bench_router.py --dp 2 --model CONFIG_DIR --load-format dummy \
        --groups 64 --prompts-per-group 16 --system-prompt-len 2048 --question-len 128 \
        --output-len 256 --concurrency 256 --baseline
    # Or replicas already running anywhere:
    python benchmarks/bench_router.py --worker-urls http://h1:30000 http://h2:30000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from sgdsl.runtime.launcher.replicas import gpu_slices, start_replicas, stop_replicas

sys.path.insert(0, str(Path(__file__).resolve().parent))  # imported by tests too
from proc_stats import cpu_seconds  # noqa: E402
from tiny_llama import tiny_llama_dir  # noqa: E402



def make_workload(tokenizer: Any, args: argparse.Namespace) -> list[str]:
    """Prompts of exact token lengths: random token ids decoded to text, as SGLang's
    generated-shared-prefix dataset does."""
    rng = random.Random(args.seed)
    vocab = [i for i in range(1000, min(tokenizer.vocab_size, 30000))]

    def text(n: int) -> str:
        return tokenizer.decode([rng.choice(vocab) for _ in range(n)])

    prompts = []
    for _ in range(args.groups):
        system = text(args.system_prompt_len)
        prompts += [system + text(args.question_len) for _ in range(args.prompts_per_group)]
    rng.shuffle(prompts)
    return prompts


async def run_workload(url: str, prompts: list[str], args: argparse.Namespace,
                       headers: dict[str, str]) -> dict[str, float]:
    sem = asyncio.Semaphore(args.concurrency)
    totals: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0, "failed": 0}
    errors: list[str] = []
    limits = httpx.Limits(max_connections=args.concurrency + 8)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=None,
                                 limits=limits) as client:
        async def one(prompt: str) -> None:
            async with sem:
                try:
                    r = await client.post("/generate", json={"text": prompt, "sampling_params": {
                        "max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}})
                except httpx.HTTPError as exc:  # counted with its reason, not the whole run lost
                    totals["failed"] += 1
                    errors.append(f"{type(exc).__name__}: {exc!r}")
                    return
            if r.status_code != 200:
                totals["failed"] += 1
                errors.append(f"{r.status_code}: {r.text[:300]}")
                return
            meta = r.json()["meta_info"]
            totals["prompt_tokens"] += meta["prompt_tokens"]
            totals["completion_tokens"] += meta["completion_tokens"]

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(p) for p in prompts))
        totals["seconds"] = time.perf_counter() - started
        totals["client_cpu_s"] = time.process_time() - cpu
    if errors:
        print(f"{len(errors)} requests failed, the first: {errors[0]}", flush=True)
    return totals


def _client_process(url: str, prompts: list[str], options: dict[str, Any],
                    headers: dict[str, str], barrier: Any, results: Any) -> None:
    """One of ``--client-procs`` client processes: its share of the prompts and concurrency."""
    args = argparse.Namespace(**options)
    barrier.wait()  # all start together, after their imports
    started = time.time()
    totals = asyncio.run(run_workload(url, prompts, args, headers))
    results.put((started, time.time(), totals))


def run_clients(url: str, prompts: list[str], args: argparse.Namespace,
                headers: dict[str, str]) -> dict[str, float]:
    """The workload from ``--client-procs`` processes (prompt k to process k mod N, the
    concurrency split among them). One asyncio+httpx process spends ~17 ms of CPU a request at
    256 in flight (H200 dp=4: 17-19 CPU s per 24-30 s round): near one core, it caps what the
    replicas can show."""
    n = max(1, min(args.client_procs, args.concurrency, len(prompts)))
    if n == 1:
        return asyncio.run(run_workload(url, prompts, args, headers))
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=_client_process, daemon=True, args=(
        url, prompts[k::n], {**vars(args), "concurrency": args.concurrency // n
                             + (k < args.concurrency % n)}, headers, barrier, results))
        for k in range(n)]
    for proc in procs:
        proc.start()
    barrier.wait()
    parts = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    totals = {key: sum(p[2][key] for p in parts) for key in parts[0][2]}
    totals["seconds"] = max(p[1] for p in parts) - min(p[0] for p in parts)
    return totals


def cache_counters(workers: list[str], headers: dict[str, str]) -> tuple[float, float]:
    """(hit tokens, prompt tokens) summed over the replicas' /metrics."""
    hit = prompt = 0.0
    for url in workers:
        for line in httpx.get(f"{url}/metrics", headers=headers, timeout=30).text.splitlines():
            name, _, value = line.partition(" ")
            if name == "sgdsl_engine_cache_hit_tokens_total":
                hit += float(value)
            elif name == "sgdsl_engine_prompt_tokens_total":
                prompt += float(value)
    return hit, prompt


def measure(label: str, url: str, workers: list[str], prompts: list[str],
            args: argparse.Namespace, headers: dict[str, str]) -> dict[str, Any]:
    for w in workers:
        httpx.post(f"{w}/flush_cache", headers=headers, timeout=60).raise_for_status()
    hit0, prompt0 = cache_counters(workers, headers)
    t = run_clients(url, prompts, args, headers)
    hit1, prompt1 = cache_counters(workers, headers)
    tokens = t["prompt_tokens"] + t["completion_tokens"]
    return {"label": label, "seconds": t["seconds"], "failed": int(t["failed"]),
            "total_tok_s": tokens / t["seconds"],
            "output_tok_s": t["completion_tokens"] / t["seconds"],
            "hit_rate": (hit1 - hit0) / max(1.0, prompt1 - prompt0),
            "client_cpu_s": t["client_cpu_s"]}


def policy_flags(spec: str) -> list[str]:
    """``name[:key=value+key=value]`` as ``sgdsl router`` flags."""
    name, _, options = spec.partition(":")
    flags = ["--policy", name]
    for option in filter(None, options.split("+")):
        key, _, value = option.partition("=")
        flags += ["--" + key.strip().replace("_", "-"), value.strip()]
    return flags


def served_balance(url: str, headers: dict[str, str]) -> float:
    """Most / fewest requests a worker served through this router (1.0: even)."""
    listing = httpx.get(f"{url}/list_workers", headers=headers, timeout=30).json()
    served = [w["served"] for w in listing["workers"]]
    return max(served) / max(1, min(served))


def decisions(url: str, headers: dict[str, str]) -> dict[str, int]:
    """The router's choices by reason (its /metrics), e.g. cost_aware's ``affinity`` (a worker
    with less work passed over for the cache) and ``least_work``."""
    counts: dict[str, int] = {}
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text
    for line in text.splitlines():
        if line.startswith("sgdsl_router_policy_decisions_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            counts[reason] = counts.get(reason, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def with_router(policy: str, workers: list[str], args: argparse.Namespace,
                prompts: list[str], headers: dict[str, str]) -> dict[str, Any]:
    """A fresh ``sgdsl router`` process (as deployed: its own interpreter, not this one's)."""
    cmd = [sys.executable, "-m", "sgdsl.runtime.router", "--worker-urls", *workers,
           *policy_flags(policy), *args.router_args.split(), "--host", "127.0.0.1", "--port", "0",
           *(["--worker-api-key", args.api_key, "--api-key", args.api_key]
             if args.api_key else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = ""
        for line in proc.stdout:
            if "listening on " in line:
                url = line.split("listening on ")[1].split()[0]
                break
        if not url:
            raise RuntimeError(f"router ({policy}) did not start")
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        cpu = cpu_seconds(proc.pid)
        row = measure(policy, url, workers, prompts, args, headers)
        # The router is one Python process: near 1 CPU-second per second, it is the bottleneck.
        row["router_cpu_s"] = cpu_seconds(proc.pid) - cpu
        row["balance"] = served_balance(url, headers)
        row["decisions"] = decisions(url, headers)
        return row
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def launch(args: argparse.Namespace) -> tuple[list, list[str]]:
    model, load_format = args.model, args.load_format
    if args.tiny:
        model, load_format = tiny_llama_dir(), "dummy"
    argv = [*(["--model", model] if model else []), "--load-format", load_format,
            *(["--tp-size", str(args.tp)] if args.tp > 1 else []), *args.server_args.split()]
    replicas = start_replicas(args.dp, argv, gpu_slices(args.dp, args.tp, args.device))
    return replicas, [r.url for r in replicas]


def tokenizer_for(workers: list[str], headers: dict[str, str], args: argparse.Namespace) -> Any:
    from transformers import AutoTokenizer

    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    info = httpx.get(f"{workers[0]}/get_model_info", headers=headers, timeout=30).json()
    return AutoTokenizer.from_pretrained(info.get("tokenizer_path") or info["model_path"])


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median throughput (its hit rate with it)."""
    runs = sorted(runs, key=lambda r: r["total_tok_s"])
    row = dict(runs[len(runs) // 2])
    row["rounds"] = [round(r["total_tok_s"], 1) for r in runs]
    row["hit_rate_spread"] = statistics.pstdev([r["hit_rate"] for r in runs])
    return row


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nshared-prefix workload: {args.groups} groups x {args.prompts_per_group} prompts, "
          f"system {args.system_prompt_len} + question {args.question_len} tokens, "
          f"output {args.output_len}, concurrency {args.concurrency}, replicas {args.dp_used}")
    rr = next((r for r in rows if r["label"] == "round_robin"), None)
    width = max(14, *(len(r["label"]) + 2 for r in rows))
    print(f"{'run':<{width}}{'seconds':>9}{'total tok/s':>13}{'out tok/s':>11}{'hit rate':>10}"
          f"{'balance':>9}{'failed':>8}{'vs rr':>8}")
    for r in rows:
        ratio = f"{r['total_tok_s'] / rr['total_tok_s']:.2f}x" if rr and rr["total_tok_s"] else "-"
        balance = f"{r['balance']:.2f}" if "balance" in r else "-"
        print(f"{r['label']:<{width}}{r['seconds']:>9.2f}{r['total_tok_s']:>13.1f}"
              f"{r['output_tok_s']:>11.1f}{r['hit_rate']:>10.1%}{balance:>9}{r['failed']:>8}"
              f"{ratio:>8}")
    if rr and rr["total_tok_s"]:
        for r in rows:
            if r is not rr and r["label"] != "one replica":
                print(f"{r['label']} / round_robin throughput: "
                      f"{r['total_tok_s'] / rr['total_tok_s']:.2f}x; hit rate "
                      f"{r['hit_rate']:.1%} vs {rr['hit_rate']:.1%}")
    print(json.dumps(rows))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker-urls", nargs="*", default=[], help="running replicas to use")
    p.add_argument("--dp", type=int, default=2, help="replicas to start (without --worker-urls)")
    p.add_argument("--tp", type=int, default=1, help="GPUs per replica (their --tp-size)")
    p.add_argument("--model", default=None, help="model for started replicas")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--tiny", action="store_true", help="a tiny random Llama (CPU runs)")
    p.add_argument("--server-args", default="", help="more flags for started replicas")
    p.add_argument("--tokenizer", default=None, help="default: the replicas' own")
    p.add_argument("--api-key", default=None)
    p.add_argument("--policies", default="cost_aware,round_robin,cache_aware",
                   help="comma-separated; each NAME[:key=value+key=value] (router options)")
    p.add_argument("--router-args", default="--health-timeout-s 30",
                   help="more flags for every router (default: patient health checks, as a "
                        "CPU step under load can outlast the default 5 s)")
    p.add_argument("--baseline", action="store_true", help="also run on one replica alone")
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--system-prompt-len", type=int, default=2048)
    p.add_argument("--question-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--rounds", type=int, default=1, help="runs per policy (median reported)")
    p.add_argument("--client-procs", type=int, default=1,
                   help="client processes sharing the prompts and the concurrency")
    p.add_argument("--warmup", type=int, default=4, help="requests per replica before measuring")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    started = time.perf_counter()
    replicas, workers = ([], list(args.worker_urls)) if args.worker_urls else launch(args)
    args.dp_used = len(workers)
    print(f"{len(workers)} replicas ready in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        prompts = make_workload(tokenizer_for(workers, headers, args), args)
        warm = argparse.Namespace(**{**vars(args), "concurrency": args.warmup})
        for w in workers:
            asyncio.run(run_workload(w, prompts[:args.warmup], warm, headers))
        policies = args.policies.split(",")
        runs: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
        for k in range(args.rounds):  # alternate the order so neither policy always goes first
            for policy in (policies if k % 2 == 0 else policies[::-1]):
                row = with_router(policy, workers, args, prompts, headers)
                runs[policy].append(row)
                # As it comes: a run cut short by a time limit still shows what it measured.
                print(f"round {k + 1} {policy}: {row['total_tok_s']:.1f} tok/s, hit rate "
                      f"{row['hit_rate']:.1%}, balance {row['balance']:.2f}; CPU s over "
                      f"{row['seconds']:.1f} s: router {row['router_cpu_s']:.1f}, client "
                      f"{row['client_cpu_s']:.1f}; decisions {row['decisions']}", flush=True)
        rows = [_median(r) for r in runs.values()]
        if args.baseline:
            rows.append(measure("one replica", workers[0], workers[:1], prompts, args, headers))
        report(rows, args)
    finally:
        stop_replicas(replicas)


if __name__ == "__main__":
    main()

"""Prefill/decode disaggregation vs colocated replicas, behind the router, in one run.

Two set-ups over the same GPUs (one each) and the same model: ``pd`` (a prefill server on
GPU 0, a decode server on GPU 1, ``sgdsl router --pd-disaggregation``) and ``colocated`` (two
plain servers, ``sgdsl router`` over both). The workload mixes two classes arriving at a fixed
total rate (Poisson): long prompts (``--long-in`` tokens in, ``--long-out`` out) and chat turns
(``--chat-in`` in, ``--chat-out`` out), random token ids, ignore_eos, streamed over native
``/generate``. Reported per set-up and class: TTFT p50/p99 (first chunk), ITL p50/p99 (gaps
between chunks), tokITL p50/p99 (per token, as SGLang's bench_serving counts a native stream:
a chunk of k new tokens is k gaps of 1/k of its wait; with random token ids a dummy model's
tokens are often incomplete UTF-8 characters, whose text the server holds back until the next
token, so a chunk gap spans several steps), and the total throughput ((prompt + output tokens)
/ wall); then pd / colocated ratios (ITL, TTFT: lower is better; throughput: higher is
better). ``--client-procs N`` deals the arrivals to N client processes; ``--hop-times`` reports
which hop each large gap was born in (hop_report.py). ``pd-gloo``
(in ``--modes``) is ``pd`` over the host-staged gloo transfer, which puts no NCCL kernel on
either GPU: comparing the two isolates what the NCCL transfer does to the decode loop.
``--trace DIR`` records every server's scheduler steps ($SGDSL_STEP_TRACE) and prints, per
server, the launch-to-launch gaps and the slowest iterations with where their time went.

    # GPU (2 GPUs), a Llama-3.1-8B shape with dummy weights:
    python benchmarks/gpu/bench_pd.py --model benchmarks/gpu/configs/llama-3.1-8b \
        --load-format dummy --rate 4 --duration 90
    # tensor parallelism (issue 27): a TP=2 prefill server on GPUs 0-1, a TP=1 decode server on
    # GPU 2 (4 GPUs: the colocated replicas run at --tp-size 2):
    python benchmarks/gpu/bench_pd.py --model benchmarks/gpu/configs/llama-3.1-8b \
        --load-format dummy --rate 4 --duration 60 --tp-size 2 --decode-tp 1
    # CPU smoke, tiny random model:
    python benchmarks/gpu/bench_pd.py --tiny --rate 2 --duration 10 --long-in 256 \
        --long-out 8 --chat-in 32 --chat-out 16
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_llama import tiny_llama_dir  # noqa: E402  (benchmarks/ is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hop_report  # noqa: E402
import pd_client  # noqa: E402
import step_trace_report  # noqa: E402

from sgdsl.runtime.launcher.replicas import gpu_slices, launch, stop_replicas  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(argvs: list[list[str]], gpus: list[str | None],
                  traces: list[str | None] | None = None) -> list[Any]:
    """One server per argv (its own GPU), their URLs once listening. ``traces``: each
    server's $SGDSL_STEP_TRACE folder (or None)."""
    servers = []
    for i, (argv, gpu) in enumerate(zip(argvs, gpus)):
        trace = traces[i] if traces else None
        os.environ.pop("SGDSL_STEP_TRACE", None)
        if trace:
            os.environ["SGDSL_STEP_TRACE"] = trace
        servers.append(launch(i, argv, gpu))
    os.environ.pop("SGDSL_STEP_TRACE", None)
    for s in servers:
        for line in s.proc.stdout:
            if "listening on " in line:
                s.url = line.split("listening on ")[1].split()[0]
                break
            s.lines = (s.lines + [line])[-40:]
        if not s.url:
            stop_replicas(servers)
            raise RuntimeError(f"server {s.index} did not start:\n{''.join(s.lines)}")
        threading.Thread(target=_keep_hops, args=(s.proc.stdout,), daemon=True).start()
    return servers


HOP_LINES: list[str] = []  # the servers' and router's "[hops] ..." lines (long GC pauses)


def _keep_hops(stream: Any) -> None:
    """Read a child's output to its end, keeping its hop-times lines."""
    for line in stream:
        if line.startswith("[hops]"):
            HOP_LINES.append(line.rstrip())


def start_router(flags: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "sgdsl.runtime.router", *flags, "--host", "127.0.0.1",
           "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if "listening on " in line:
            threading.Thread(target=_keep_hops, args=(proc.stdout,), daemon=True).start()
            return proc, line.split("listening on ")[1].split()[0]
    raise RuntimeError("router did not start")


def workload(args: argparse.Namespace, vocab: int) -> list[tuple[float, str, list[int], int]]:
    """(arrival second, class, prompt ids, output tokens), Poisson arrivals at ``rate``."""
    rng = random.Random(args.seed)
    out, t = [], 0.0
    while t < args.duration:
        long = rng.random() < args.long_share
        n_in, n_out = (args.long_in, args.long_out) if long else (args.chat_in, args.chat_out)
        out.append((t, "long" if long else "chat",
                    [rng.randrange(1000, vocab - 1) for _ in range(n_in)], n_out))
        t += rng.expovariate(args.rate)
    return out


def run(url: str, reqs: list, args: argparse.Namespace) -> dict[str, Any]:
    arrivals = [(at, ids, n) for at, _, ids, n in reqs]
    results, wall, cpu = pd_client.run_split(url, arrivals, args.client_procs)
    row: dict[str, Any] = {"wall_s": wall, "client_cpu_s": cpu,
                           "failed": sum("error" in r for r in results)}
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        print(f"  {len(errors)} failed, the first: {errors[0]}", flush=True)
    ok = [(c, r) for (_, c, _, _), r in zip(reqs, results) if "error" not in r]
    tokens = sum(r["prompt"] + r["output"] for _, r in ok)
    row["total_tok_s"] = tokens / wall
    row["output_tok_s"] = sum(r["output"] for _, r in ok) / wall
    for cls in ("long", "chat"):
        mine = [r for c, r in ok if c == cls]
        itl = [x for r in mine for x in r["itl"]]
        first = [r["itl"][0] for r in mine if r["itl"]]  # first -> second token: pd's join
        rest = [x for r in mine for x in r["itl"][1:]]
        row[cls] = {"n": len(mine), "ttft_p50": pct([r["ttft"] for r in mine], 50),
                    "ttft_p99": pct([r["ttft"] for r in mine], 99),
                    "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99),
                    "itl0_p99": pct(first, 99), "itl_rest_p99": pct(rest, 99),
                    "itl_max": max(itl, default=float("nan"))}
        tok = [x for r in mine for x in r["tok_itl"]]  # per token (SGLang's bench_serving)
        row[cls].update(tok_itl_p50=pct(tok, 50), tok_itl_p99=pct(tok, 99))
        if args.hop_times:
            row[cls]["hops"] = hop_report.summarize(mine, f"hops {cls}")
    return row


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def trace_dirs(mode: str, args: argparse.Namespace) -> list[str | None]:
    names = ["prefill", "decode"] if mode.startswith("pd") else ["replica0", "replica1"]
    return [os.path.join(args.trace, f"{mode}-{n}") if args.trace else None for n in names]


def setup(mode: str, args: argparse.Namespace, model: list[str], gpus: list[str | None]):
    base = [*model, *args.server_args.split()]
    traces = trace_dirs(mode, args)
    if mode.startswith("pd"):
        if mode == "pd-gloo":  # the host-staged transfer: no NCCL kernel on either GPU
            base += ["--disaggregation-transfer-backend", "gloo"]
        port = free_port()
        argvs = [base + ["--disaggregation-mode", "prefill", "--tp-size", str(args.prefill_tp),
                         "--disaggregation-bootstrap-port", str(port)],
                 base + ["--disaggregation-mode", "decode", "--tp-size", str(args.decode_tp)]]
        servers = start_servers(argvs, pd_gpus(gpus, args), traces)
        flags = ["--pd-disaggregation", "--prefill", servers[0].url, str(port),
                 "--decode", servers[1].url]
    else:
        tp = ["--tp-size", str(args.tp_size)]
        servers = start_servers([base + tp, base + tp], gpus, traces)
        flags = ["--worker-urls", servers[0].url, servers[1].url]
    router, url = start_router(flags + args.router_args.split())
    return servers, router, url


def pd_gpus(gpus: list[str | None], args: argparse.Namespace) -> list[str | None]:
    """The prefill server's GPUs, then the decode server's (tensor parallelism: each its
    ``--prefill-tp`` / ``--decode-tp`` first of the GPUs the colocated replicas use)."""
    if gpus[0] is None:
        return gpus
    ids = ",".join(gpus).split(",")
    need = args.prefill_tp + args.decode_tp
    if need > len(ids):
        raise SystemExit(f"--prefill-tp + --decode-tp = {need} GPUs, {len(ids)} given")
    return [",".join(ids[:args.prefill_tp]), ",".join(ids[args.prefill_tp:need])]


def measure(mode: str, args: argparse.Namespace, model: list[str], gpus: list) -> dict:
    servers, router, url = setup(mode, args, model, gpus)
    try:
        vocab = httpx.get(f"{servers[0].url}/get_model_info", timeout=60).json().get(
            "vocab_size") or 32000
        warm = workload(argparse.Namespace(**{**vars(args), "duration": 2.0, "seed": 99}), vocab)
        run(url, warm[:4], args)  # first requests (graphs, allocator) unmeasured
        HOP_LINES.clear()
        row = run(url, workload(args, vocab), args)
        row["gc"] = list(HOP_LINES)
        row["stats"] = [server_stats(s.url) for s in servers]
        row["mode"] = mode
        return row
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(timeout=60)
        stop_replicas(servers)
        for folder in trace_dirs(mode, args):
            path = os.path.join(folder or "", "steps-rank0.jsonl")
            if folder and os.path.exists(path):
                print(step_trace_report.summarize(path), flush=True)


def server_stats(url: str) -> dict:
    """What each server did (did the decode server prefill anything? transfers, retractions)."""
    try:
        stats = httpx.get(f"{url}/get_server_info", timeout=30).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": str(exc)}
    keys = ("forward_steps", "extend_steps", "retractions_total", "cache_hit_rate")
    return {k: v for k, v in stats.items() if k in keys or k.startswith("pd_")}


def report(rows: list[dict]) -> None:
    print(f"{'mode':<10} {'class':<5} {'n':>4} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'ITL p50':>8} {'ITL p99':>8} {'1st gap p99':>11} {'later p99':>9} "
          f"{'ITL max':>8} {'tokITL p50':>10} {'tokITL p99':>10}   (ms; ITL: between chunks, "
          f"tokITL: per token)")
    for row in rows:
        for cls in ("long", "chat"):
            c = row[cls]
            print(f"{row['mode']:<10} {cls:<5} {c['n']:>4} {c['ttft_p50'] * 1e3:>9.1f} "
                  f"{c['ttft_p99'] * 1e3:>9.1f} {c['itl_p50'] * 1e3:>8.1f} "
                  f"{c['itl_p99'] * 1e3:>8.1f} {c['itl0_p99'] * 1e3:>11.1f} "
                  f"{c['itl_rest_p99'] * 1e3:>9.1f} {c['itl_max'] * 1e3:>8.1f} "
                  f"{c['tok_itl_p50'] * 1e3:>10.1f} {c['tok_itl_p99'] * 1e3:>10.1f}")
        print(f"{row['mode']:<10} servers: {row.get('stats')}")
        print(f"{row['mode']:<10} total {row['total_tok_s']:.0f} tok/s, output "
              f"{row['output_tok_s']:.0f} tok/s, wall {row['wall_s']:.1f} s, "
              f"failed {row['failed']}, client CPU {row['client_cpu_s']:.1f} s")
        for cls in ("long", "chat"):
            if "hops" in row[cls]:
                print(f"{row['mode']:<10} {row[cls]['hops']}")
        if row.get("gc"):
            longest = sorted(row["gc"], key=lambda g: -float(g.split("ms=")[1].split()[0]))
            print(f"{row['mode']:<10} {len(row['gc'])} GC pauses >= 2 ms during the run, "
                  f"the longest: " + "; ".join(longest[:3]))
    by = {r["mode"]: r for r in rows}
    co = by.get("colocated")
    for name in ("pd", "pd-gloo"):
        pd = by.get(name)
        if pd is None or co is None:
            continue
        for cls in ("long", "chat"):
            print(f"ratio {name}/colocated {cls}: ITL p99 "
                  f"{pd[cls]['itl_p99'] / co[cls]['itl_p99']:.2f}x (per token "
                  f"{pd[cls]['tok_itl_p99'] / co[cls]['tok_itl_p99']:.2f}x), "
                  f"TTFT p99 {pd[cls]['ttft_p99'] / co[cls]['ttft_p99']:.2f}x")
        print(f"ratio {name}/colocated total throughput "
              f"{pd['total_tok_s'] / co['total_tok_s']:.2f}x")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--tiny", action="store_true", help="tiny random model (CPU smoke)")
    p.add_argument("--modes", default="pd,colocated",
                   help="comma-separated: pd (NCCL on GPUs), pd-gloo (host-staged), colocated")
    p.add_argument("--rate", type=float, default=4.0, help="requests per second, both classes")
    p.add_argument("--duration", type=float, default=90.0, help="seconds of arrivals")
    p.add_argument("--long-share", type=float, default=0.15)
    p.add_argument("--long-in", type=int, default=8192)
    p.add_argument("--long-out", type=int, default=64)
    p.add_argument("--chat-in", type=int, default=512)
    p.add_argument("--chat-out", type=int, default=256)
    p.add_argument("--server-args", default="", help="extra flags for every server")
    p.add_argument("--router-args", default="", help="extra flags for the routers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tp-size", type=int, default=1,
                   help="each colocated replica's tp size (2 x this many GPUs in all)")
    p.add_argument("--prefill-tp", type=int, default=None,
                   help="the PD prefill server's tp size (default --tp-size)")
    p.add_argument("--decode-tp", type=int, default=None,
                   help="the PD decode server's tp size (default --tp-size)")
    p.add_argument("--client-procs", type=int, default=1,
                   help="client processes the arrivals are dealt to (1: this one)")
    p.add_argument("--hop-times", action="store_true",
                   help="$SGDSL_HOP_TIMES=1 on servers and routers: report which hop "
                   "(scheduler, main process, server, router, client) each large gap came from")
    p.add_argument("--trace", default="", help="folder: each server's step trace "
                   "($SGDSL_STEP_TRACE), summarized after its run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.prefill_tp = args.prefill_tp or args.tp_size
    args.decode_tp = args.decode_tp or args.tp_size
    if args.hop_times:  # inherited by every server and router started from here
        os.environ["SGDSL_HOP_TIMES"] = "1"
    model = (["--model", tiny_llama_dir(), "--load-format", "dummy"] if args.tiny else
             [*(["--model", args.model] if args.model else []), "--load-format", args.load_format])
    per_server = max(args.tp_size, (args.prefill_tp + args.decode_tp + 1) // 2)
    gpus = gpu_slices(2, per_server, "auto")
    rows = []
    for mode in args.modes.split(","):
        print(f"== {mode}", flush=True)
        rows.append(measure(mode, args, model, gpus))
        report(rows)  # after every mode: a run cut short by its time limit still tells


if __name__ == "__main__":
    main()

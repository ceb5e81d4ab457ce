"""Host CPU per request of ``sgdsl serve`` on the router's workload shape, by process and thread.

The router runs (``run_router_suite.sh``) send native ``/generate`` requests whose ``text`` is a
~2k-token prompt sharing a per-group prefix (SGLang's generated-shared-prefix shape, the same
``make_workload`` as ``bench_router.py``). With a tiny random model the forwards are cheap and
what is left is the host: this prints, per request, the CPU seconds of the server's main process
(split by thread: the HTTP event loop, the Engine's loop, tokenizer threads) and of the
scheduler process, plus the scheduler's forward counts, so a change's effect reads per process.
``--python NAME=PATH`` adds servers run by other interpreters (another tree's venv) for a
before/after in one run (rounds interleave the servers). ``--profile DIR`` records py-spy
flame data of both processes during the last round.

    python benchmarks/bench_server_host.py --groups 16 --prompts-per-group 16 \\
        --system-prompt-len 2048 --question-len 128 --output-len 4 --concurrency 256
    # GPU: the 8B dummy at its size; SGDSL_STEP_TRACE=DIR adds the scheduler's steps by part
    python benchmarks/bench_server_host.py --full --groups 24 --output-len 128 --concurrency 64 \\
        --max-total-tokens 60000
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from proc_stats import cpu_seconds as cpu_s, descendants as children  # noqa: E402
from bench_router import make_workload  # noqa: E402
from common import model_dir, tiny_model_dir  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of ``pid`` (threads of one name summed)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            base = Path(f"/proc/{pid}/task/{tid}")
            name = (base / "comm").read_text().strip()
            fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # the main thread runs uvicorn's event loop; Python's own threads (the Engine's loop,
        # the encode pool) all show the interpreter's name
        name = "loop" if tid == str(pid) else re.sub(r"[-_]?\d+$", "", name) or name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def scheduler_pid(kids: list[int]) -> int:
    """The scheduler among the server's children (not multiprocessing's resource tracker)."""
    return next(k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes())


def start(python: str, model: str, a: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [python, "-m", "sgdsl.runtime.server", "--model", model, "--port", "0",
           "--load-format", "dummy", "--num-threads", "1", "--grammar-backend", "none",
           "--max-running-requests", str(a.concurrency), "--context-length", "4096",
           "--max-total-tokens", str(a.max_total_tokens), *a.server_args.split()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, re.search(r"(http://\S+)", proc.stdout.readline()).group(1)


async def send_all(url: str, prompts: list[str], a: argparse.Namespace) -> int:
    import aiohttp

    sem = asyncio.Semaphore(a.concurrency)
    sp = {"max_new_tokens": a.output_len, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=0)) as client:
        async def one(prompt: str) -> int:
            async with sem:
                async with client.post("/generate", json={"text": prompt,
                                                          "sampling_params": sp}) as r:
                    out = await r.json()
            return out["meta_info"]["prompt_tokens"] + out["meta_info"]["completion_tokens"]
        return sum(await asyncio.gather(*(one(p) for p in prompts)))


def counters(url: str) -> dict[str, float]:
    info = httpx.get(url + "/get_server_info", timeout=60).json()
    return {k: info.get(k, 0) for k in ("forward_steps", "extend_steps", "cache_hit_tokens",
                                         "cache_query_tokens", "submit_handoffs")}


def measure(proc: subprocess.Popen, url: str, prompts: list[str], a: argparse.Namespace,
            profile: str | None = None) -> dict[str, Any]:
    httpx.post(url + "/flush_cache", timeout=60)
    kids = children(proc.pid)
    before = (thread_cpu(proc.pid), sum(map(cpu_s, kids)), counters(url))
    spies = [subprocess.Popen(["py-spy", "record", "-r", "200", "-f", "raw", "-o",
                               f"{profile}_{tag}.txt", "-p", str(pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for tag, pid in (("main", proc.pid), ("sched", scheduler_pid(kids)))] if profile else []
    t0 = time.perf_counter()
    tokens = asyncio.run(send_all(url, prompts, a))
    wall = time.perf_counter() - t0
    for spy in spies:
        spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
        spy.wait(60)
    threads, sched, count = thread_cpu(proc.pid), sum(map(cpu_s, kids)), counters(url)
    per = {k: v - before[0].get(k, 0.0) for k, v in threads.items()}
    diff = {k: count[k] - before[2][k] for k in count}
    return {"wall": wall, "tokens": tokens, "threads": per, "main": sum(per.values()),
            "sched": sched - before[1], "n": len(prompts), **diff}


def report(r: int, name: str, m: dict[str, Any]) -> None:
    n = m["n"]
    top = sorted(m["threads"].items(), key=lambda kv: -kv[1])[:4]
    split = ", ".join(f"{k} {1000 * v / n:.2f}" for k, v in top if v > 0)
    hit = m["cache_hit_tokens"] / max(m["cache_query_tokens"], 1)
    print(f"round {r} server {name:6s} wall {m['wall']:6.2f} s "
          f"{m['tokens'] / m['wall']:8.0f} tok/s (prompt + output)  ms/request CPU: main "
          f"{1000 * m['main'] / n:.2f} ({split}), scheduler {1000 * m['sched'] / n:.2f}  "
          f"forwards {m['forward_steps']:.0f} extends {m['extend_steps']:.0f} hit {hit:.1%} "
          f"hand-offs {m['submit_handoffs']:.0f}", flush=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--prompts-per-group", type=int, default=16)
    ap.add_argument("--system-prompt-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--max-total-tokens", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-config", default=model_dir("llama-3.1-8b"),
                    help="config dir whose tokenizer is used (layers shrunk to tiny)")
    ap.add_argument("--full", action="store_true",
                    help="the config's own size (a GPU run: --load-format dummy weights)")
    ap.add_argument("--server-args", default="", help="extra server flags, one string")
    ap.add_argument("--python", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--profile", default=None, metavar="PREFIX",
                    help="py-spy raw stacks of both processes in the last round")
    return ap.parse_args()


def main() -> None:
    a = parse_args()
    model = a.model_config if a.full else tiny_model_dir(a.model_config)
    from transformers import AutoTokenizer

    prompts = make_workload(AutoTokenizer.from_pretrained(model), a)
    pythons = [("this", sys.executable)] + [tuple(p.split("=", 1)) for p in a.python]
    servers = {name: start(py, model, a) for name, py in pythons}
    try:
        for name, (proc, url) in servers.items():  # warm-up
            measure(proc, url, prompts[:8], a)
        for r in range(a.rounds):
            for name, (proc, url) in servers.items():
                last = r == a.rounds - 1 and a.profile
                report(r, name, measure(proc, url, prompts, a,
                                        f"{a.profile}_{name}" if last else None))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()

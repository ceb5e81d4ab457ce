"""``ClientPool``: one batch of HTTP requests driven from N client processes instead of one.

The official ``openai`` client spends ~1-4 ms of its own process's CPU per request (building
the request, parsing the response into its models); at batch 256 one Python process then paces
the run (issue 29: 0.61-0.98 s of client CPU in a 2.9-3.3 s wall). Spread over N processes, the
same requests at the same total concurrency show what the server sustains; the single-process
rows still show what one client process can drive.

The processes are started once (imports, interpreter start-up: untimed) and run this file as a
worker reading JSON lines: a ``job`` (its contiguous share of the batch), then ``go``. The wall
time runs from the first ``go`` to the last answer; the CPU is the sum of the workers' own.

    python client_pool.py   # a worker (started by ClientPool, not by hand)
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_clients import Run, Workload, openai_batch, raw_batch  # noqa: E402

KINDS = ("openai", "openai-aiohttp", "chat-raw", "native-raw")


def _batch(kind: str, url: str, w: Workload) -> Any:
    """The coroutine of ``kind`` for workload ``w`` (as the single-process rows run it)."""
    if kind in ("chat-raw", "native-raw"):
        return raw_batch(url, w, kind.split("-")[0])
    return openai_batch(url, w, "aiohttp" if kind == "openai-aiohttp" else "httpx")


class ClientPool:
    """``procs`` worker processes; ``run(kind, url, w)`` splits ``w`` among them."""

    def __init__(self, procs: int) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve())]
        self.workers = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, bufsize=1) for _ in range(procs)]
        for proc in self.workers:
            self._read(proc)  # "ready": imports done

    def run(self, kind: str, url: str, w: Workload) -> Run:
        shares = _split(len(w.texts), len(self.workers))
        for proc, (lo, hi) in zip(self.workers, shares):
            self._send(proc, {"job": kind, "url": url, "workload": asdict(_slice(w, lo, hi))})
        for proc in self.workers:
            self._read(proc)  # "loaded"
        t0 = time.perf_counter()
        for proc in self.workers:
            self._send(proc, {"go": True})
        results = [self._read(proc) for proc in self.workers]
        wall = time.perf_counter() - t0
        tokens = [t for r in results for t in r["tokens"]]
        texts = [t for r in results for t in r["texts"]]
        return Run(wall, tokens, texts, sum(r["cpu"] for r in results))

    def close(self) -> None:
        for proc in self.workers:
            proc.stdin.close()
            proc.wait(60)

    @staticmethod
    def _send(proc: subprocess.Popen, message: dict[str, Any]) -> None:
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()

    @staticmethod
    def _read(proc: subprocess.Popen) -> dict[str, Any]:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"client process {proc.pid} exited ({proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"client process {proc.pid}: {reply['error']}")
        return reply


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous [lo, hi) shares of n items, sizes differing by at most one."""
    bounds = [n * k // parts for k in range(parts + 1)]
    return list(zip(bounds, bounds[1:]))


def _slice(w: Workload, lo: int, hi: int) -> Workload:
    return Workload(w.texts[lo:hi], w.ids[lo:hi], w.budgets[lo:hi], w.constrained,
                    None if w.users is None else w.users[lo:hi])


def worker() -> None:
    """Read jobs from stdin; answer each ``go`` with the share's tokens, texts and CPU."""
    print(json.dumps({"ready": True}), flush=True)
    job: dict[str, Any] = {}
    for line in sys.stdin:
        message = json.loads(line)
        if "job" in message:
            job = message
            print(json.dumps({"loaded": True}), flush=True)
            continue
        try:
            w = Workload(**job["workload"])
            cpu0 = time.process_time()
            tokens, texts = ([], []) if not w.texts else asyncio.run(
                _batch(job["job"], job["url"], w))
            reply = {"tokens": tokens, "texts": texts, "cpu": time.process_time() - cpu0}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    worker()

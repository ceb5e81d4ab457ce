"""One hierarchical-cache move in isolation: the host time to *issue* a load (host -> device)
and a backup (device -> host), and the device time of the copy, through the KV move kernel
(``KernelIO``: one launch per layer / per move, zero-copy over UVA) vs the plain copies
(a ``copy_`` per layer x K/V x run, hicache_io_backend=direct), on Llama-3.1-8B's KV shape
(32 layers x 8 KV heads x 128, bf16: 128 KiB a token). ``kernel/g``: g layers per load
launch (1, the default, keeps the finest layer-wise overlap).

Slot patterns (``--patterns``): ``prefill``: contiguous in both pools (a fresh prefill's
slots: the plain copies' best case, one DMA per layer x K/V); ``turn``: a chat turn, its
context contiguous and its last 64 tokens decode slots interleaved with other requests'
(1-token stretches on the device); ``scattered``: random slots on both sides. Each repetition
starts on an idle device (synchronized), so the issue time is the call's own cost, not a
queue's. Medians over ``--reps``; the loaded rows are checked against the source rows.

    source benchmarks/gpu/device_env.sh && python3 benchmarks/gpu/bench_kv_move.py
    python benchmarks/gpu/bench_kv_move.py --device cpu --layers 4 --tokens 256 --reps 2
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

from sgdsl.runtime.cache.hicache.transfer import KVTransfer  # noqa: E402
from sgdsl.runtime.cache.host_pool import HostKVPool  # noqa: E402
from sgdsl.runtime.cache.pool import TokenKVPool, _raw  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float8_e4m3fn"])
    ap.add_argument("--device-slots", type=int, default=40960)
    ap.add_argument("--host-slots", type=int, default=65536)
    ap.add_argument("--tokens", default="256,2048", help="tokens per move, comma-separated")
    ap.add_argument("--patterns", default="prefill,turn,scattered")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--load-group", default="1,4",
                    help="kernel: layers per load launch (KernelIO.load_group), comma-separated")
    a = ap.parse_args(argv)
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    return a


def slots(pattern: str, n: int, dev_size: int, host_size: int, gen: torch.Generator
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(device slots, host slots) of one move of ``n`` tokens."""
    if pattern == "prefill":
        return torch.arange(1, n + 1), torch.arange(n)
    if pattern == "turn":
        tail = min(64, n)
        head = torch.arange(1, n - tail + 1)
        decode = n - tail + 1 + 8 * torch.arange(tail)  # 8 requests decoding side by side
        return torch.cat([head, decode]), torch.arange(n)
    return (torch.randperm(dev_size // 2, generator=gen)[:n] + 1,
            torch.randperm(host_size, generator=gen)[:n])


def time_move(moves: KVTransfer, a: argparse.Namespace, pattern: str, n: int) -> dict:
    dev, cuda = moves.dev, a.device == "cuda"
    gen = torch.Generator().manual_seed(n)
    src, held = slots(pattern, n, dev.size, moves.host.size, gen)
    back = src + dev.size // 2  # the other half of the pool: loads never overwrite the source
    rows = {"load_issue": [], "backup_issue": [], "load": [], "backup": []}
    for _ in range(a.reps):
        if cuda:
            torch.cuda.synchronize()
            begin = torch.cuda.Event(enable_timing=True)
            begin.record(moves.write_stream)
        start = time.perf_counter()
        moves.backup(src, held, lambda: None)
        rows["backup_issue"].append(time.perf_counter() - start)
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(moves.write_stream)
            end.synchronize()
            rows["backup"].append(begin.elapsed_time(end) / 1e3)
        moves.finish()
        before = moves.load_seconds
        start = time.perf_counter()
        moves.load(held, back, [])
        rows["load_issue"].append(time.perf_counter() - start)
        moves.dev._layer_events = None  # no attention will wait for it here
        moves.finish()
        rows["load"].append(moves.load_seconds - before)
    for layer in (0, dev.num_layers - 1):  # the round trip kept every row
        for buf in (dev.k_buffer[layer], dev.v_buffer[layer]):
            raw = _raw(buf).view(torch.uint8)
            assert torch.equal(raw[back.to(buf.device)], raw[src.to(buf.device)]), layer
    return {k: statistics.median(v) if v else 0.0 for k, v in rows.items()}


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    dtype = getattr(torch, a.dtype)
    dev = TokenKVPool(a.device_slots, a.layers, a.heads, a.dim, dtype, a.device)
    for buf in (*dev.k_buffer, *dev.v_buffer):
        _raw(buf).view(torch.uint8).random_(0, 256)
    host = HostKVPool(a.host_slots, dev, pin_memory=a.device == "cuda")
    per_token = host.bytes_per_token
    rows, issue = [], {}
    backends = [f"kernel/{g}" for g in a.load_group.split(",")] + ["copies"]
    for backend in backends:
        moves = KVTransfer(dev, host)
        if backend != "copies" and moves.io is None:
            print(f"{backend}: unavailable on this device/pool ({a.device}), copies only")
            continue
        if backend == "copies":
            moves.io = None
        else:
            moves.io.load_group = int(backend.split("/")[1])
        for pattern in a.patterns.split(","):
            for n in (int(x) for x in a.tokens.split(",")):
                t = time_move(moves, a, pattern, n)
                gb = n * per_token / 1e9
                issue[backend, pattern, n] = t
                rows.append([backend, pattern, n, 1e3 * t["load_issue"], 1e3 * t["load"],
                             gb / t["load"] if t["load"] else 0.0, 1e3 * t["backup_issue"],
                             1e3 * t["backup"], gb / t["backup"] if t["backup"] else 0.0])
    print_table(f"one KV move, {a.layers} layers x {a.heads} x {a.dim} {a.dtype} "
                f"({per_token // 1024} KiB/token), medians of {a.reps}",
                ["io", "pattern", "tokens", "load_issue_ms", "load_ms", "load_GB/s",
                 "backup_issue_ms", "backup_ms", "backup_GB/s"], rows)
    for (backend, pattern, n), t in issue.items():
        c = issue.get(("copies", pattern, n))
        if backend != "copies" and c:
            print(f"[{backend} {pattern} {n}] issue: load x{c['load_issue'] / t['load_issue']:.1f} "
                  f"backup x{c['backup_issue'] / t['backup_issue']:.1f} less host time; "
                  f"device time: load x{c['load'] / t['load']:.2f} "
                  f"backup x{c['backup'] / max(t['backup'], 1e-9):.2f} (copies / kernel)")


if __name__ == "__main__":
    main()

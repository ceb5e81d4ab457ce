"""Custom all-reduce vs NCCL (issue 30 item 1): correctness and latency per message size.

One process per GPU (the runtime's own ``init_tp_group``: NCCL + gloo). For each size from 8 KB
(a batch-1 decode all-reduce of an 8B model: 4096 bf16) to 16 MB:
- correctness: one-shot and two-shot results against an fp32 NCCL all-reduce of the same
  inputs, then 300 back-to-back all-reduces inside one CUDA graph (each input depends on the last
  output, so a race on the shared buffer shows as a wrong final value);
- latency: 50 all-reduces captured in one CUDA graph, replayed, per-op microseconds from CUDA
  events (the way the model runs them), NCCL vs one-shot vs two-shot, and the ratio.

    python bench_all_reduce.py --world 2      # nvidia-h100-x2
    python bench_all_reduce.py --world 4      # nvidia-h100-x4
"""
from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.multiprocessing as mp

from common import device_line, print_table

SIZES_KB = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
OPS_PER_GRAPH = 50


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nccl(x: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(x, group=group)
    return x


def _time_graph(fn, x: torch.Tensor) -> float:
    """Microseconds per call of ``fn(x)`` replayed from a CUDA graph of OPS_PER_GRAPH calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(OPS_PER_GRAPH):
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (10 * OPS_PER_GRAPH)


def _chain_check(ar, algo: str, numel: int, rank: int, world: int, steps: int = 300) -> bool:
    """``steps`` dependent all-reduces in one graph: y <- (allreduce(y) + rank + 1) mod 16,
    exact in bf16 and different every step, so any stale or early read of a peer's buffer
    changes the end value."""
    y0 = torch.full((numel,), float(rank), dtype=torch.bfloat16, device="cuda")
    ar.all_reduce(y0, algo)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = y0
        for _ in range(steps):
            y = torch.remainder(ar.all_reduce(y, algo) + (rank + 1), 16)
    graph.replay()
    torch.cuda.synchronize()
    vals = [float(r) for r in range(world)]
    for _ in range(steps):
        total = sum(vals)
        vals = [(total + r + 1) % 16 for r in range(world)]
    return bool((y == vals[rank]).all().item())


def worker(rank: int, world: int, port: int, out: dict) -> None:
    from sgdsl.runtime.distributed.custom_all_reduce import SymmMemAllReduce
    from sgdsl.runtime.distributed.state import init_tp_group

    g = init_tp_group(rank, world, torch.device(f"cuda:{rank}"), f"tcp://127.0.0.1:{port}")
    ar = SymmMemAllReduce.create(g, torch.bfloat16, max_bytes=max(SIZES_KB) << 10)
    assert ar is not None, "custom all-reduce unavailable on this machine"
    rows = []
    lamport_max = ar.lamport.slot * 2 if ar.lamport is not None else 0
    for kb in SIZES_KB:
        numel = (kb << 10) // 2
        gen = torch.Generator(device="cuda").manual_seed(rank)
        x = torch.randn(numel, generator=gen, device="cuda", dtype=torch.bfloat16)
        ref = _nccl(x.float().clone(), g.group)
        row = [f"{kb} KB"]
        times = {"nccl": _time_graph(lambda t: _nccl(t, g.group), x.clone())}
        for algo in ("lamport", "one_shot", "two_shot"):
            if algo == "lamport" and (kb << 10) > lamport_max:
                times[algo] = float("nan")
                row.append("-")
                continue
            err = (ar.all_reduce(x, algo).float() - ref).abs().max().item()
            ok = err <= 0.05 * world and _chain_check(ar, algo, numel, rank, world,
                                                       300 if kb <= 1024 else 20)
            times[algo] = _time_graph(lambda t, a=algo: ar.all_reduce(t, a), x)
            row.append("ok" if ok else f"WRONG (err {err:.3g})")
        best = min(t for t in (times["lamport"], times["one_shot"], times["two_shot"])
                   if t == t)
        rows.append(row + [times["nccl"], times["lamport"], times["one_shot"], times["two_shot"],
                           times["nccl"] / best, ar.choose(x)])
    fused = _fused_rows(ar, g.group) if ar.lamport is not None else []
    if rank == 0:
        out["rows"], out["fused"] = rows, fused


def _fused_rows(ar, group) -> list[list]:
    """All-reduce + residual add + RMSNorm of ``[rows, hidden]`` (a decoder layer's o_proj or
    down output): one fused kernel vs the all-reduce then ``fused_add_rmsnorm``."""
    from sgdsl.runtime.kernels.rmsnorm import fused_add_rmsnorm

    out = []
    for hidden in (4096, 8192):
        w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
        for rows in (1, 8, 32):
            x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            res = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            if not ar.lamport.fits(x):
                continue
            ref = fused_add_rmsnorm(_nccl(x.float().clone(), group).to(x.dtype), res, w, 1e-5,
                                    inplace=False)[0]
            got = ar.all_reduce_add_rmsnorm(x, res, w, 1e-5)[0]
            err = (got.float() - ref.float()).abs().max().item()
            t = {"fused": _time_graph(lambda t: ar.all_reduce_add_rmsnorm(t, res, w, 1e-5), x)}
            for algo in ("one_shot", "lamport"):
                t[algo] = _time_graph(lambda t, a=algo: fused_add_rmsnorm(
                    ar.all_reduce(t, a), res, w, 1e-5, inplace=False), x)
            t["nccl"] = _time_graph(lambda t: fused_add_rmsnorm(
                _nccl(t, group), res, w, 1e-5, inplace=False), x.clone())
            out.append([f"{rows}x{hidden}", "ok" if err < 0.1 else f"WRONG ({err:.3g})",
                        t["nccl"], t["one_shot"], t["lamport"], t["fused"],
                        t["one_shot"] / t["fused"]])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    assert torch.cuda.device_count() >= a.world, f"needs {a.world} GPUs"
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    out = mp.Manager().dict()
    mp.spawn(worker, args=(a.world, _port(), out), nprocs=a.world, join=True)
    print(device_line())
    print_table(f"custom all-reduce vs NCCL, {a.world} GPUs, bf16, us per op in a CUDA graph",
                ["size", "lamport", "one-shot", "two-shot", "NCCL us", "lamport us",
                 "one-shot us", "two-shot us", "NCCL / best custom", "plan picks"], out["rows"])
    if out["fused"]:
        print_table(f"all-reduce + add + RMSNorm, {a.world} GPUs, bf16, us per op in a CUDA graph",
                    ["rows x hidden", "fused", "NCCL + norm", "one-shot + norm",
                     "lamport + norm", "fused", "one-shot+norm / fused"], out["fused"])


if __name__ == "__main__":
    main()

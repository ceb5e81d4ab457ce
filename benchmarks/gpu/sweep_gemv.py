"""Batch-1 decode GEMMs at Llama-3.1-8B shapes, bf16 and fp8 (per-channel) weights, timed the
way a decode step runs them: 32 distinct weights of one shape back to back in a CUDA graph (no
weight in L2, no launch gaps), for every candidate of decode_gemm.py (cuBLAS, the skinny GEMM
with split-K 1/2/4) and every tile of the matrix-vector kernel (gemv.py). Then all four shapes
of 32 layers in one graph with each shape's best pick, the old picks and the default tile: the
GEMM part of a decode step; and the bf16 lm_head (4 copies). Writes the best pick per shape as a ``SGDSL_DECODE_GEMM_TABLE``
file (``--table``).

Tiles compile in a process pool first (one Triton compile is ~1 s)."""
from __future__ import annotations

import argparse
import itertools
import json
import os
from concurrent.futures import ProcessPoolExecutor

import torch

from common import print_table, replay_us
from sgdsl.runtime.kernels import decode_gemm
from sgdsl.runtime.kernels.gemv import gemv
from sgdsl.runtime.layers.quantization.fp8_utils import quantize_rows

LLAMA = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
         "down": (4096, 14336)}
LAYERS = 32


def tiles() -> list[tuple]:
    """(BLOCK_N, BLOCK_K bytes, warps) with 1 to 8 16-byte vectors per thread."""
    return [(bn, kb, wp) for bn, kb, wp in itertools.product((1, 2, 4, 8, 16), (512, 1024, 2048),
                                                             (1, 2, 4, 8))
            if 1 <= bn * kb // 16 // (32 * wp) <= 8]


def name(tile: tuple) -> str:
    return "gemv:" + ",".join(map(str, tile))


def _warm(args: tuple) -> int:
    dtype_name, chunk = args
    w = torch.randn(4096, 4096, device="cuda").to(getattr(torch, dtype_name))
    s = torch.ones(4096, device="cuda") if dtype_name.startswith("float8") else None
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    for tile in chunk:
        gemv(x, w, s, tile)
    torch.cuda.synchronize()
    return len(chunk)


def warm_all(jobs: int) -> None:
    import multiprocessing as mp

    work = [(dt, tiles()[i::jobs]) for dt in ("bfloat16", "float8_e4m3fn") for i in range(jobs)]
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        print("compiled", sum(pool.map(_warm, work)), "tiles", flush=True)


def weights(n: int, k: int, fp8: bool, count: int) -> list[tuple]:
    out = []
    for _ in range(count):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        out.append(quantize_rows(w) if fp8 else (w, None))
    return out


def graph_us(step) -> float:
    """Median us of one replay of ``step`` captured in a CUDA graph."""
    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    us = replay_us(g, 2, 7)
    del g
    return us


def chain_us(pick: str, ws: list[tuple], x: torch.Tensor) -> float:
    return graph_us(lambda: [decode_gemm._run(pick, x, w, s, None) for w, s in ws])


def sweep_shape(label: str, n: int, k: int, fp8: bool, count: int = LAYERS) -> tuple[list, dict]:
    ws = weights(n, k, fp8, count)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    nbytes = n * k * ws[0][0].element_size()
    old = decode_gemm._names(x, ws[0][0], ws[0][1], None)
    times = {c: chain_us(c, ws, x) / count
             for c in old + ["gemv"] + [name(t) for t in tiles()]}
    del ws
    torch.cuda.empty_cache()
    ranked = sorted(times, key=times.get)
    show = ranked[:5] + [c for c in old + ["gemv"] if c not in ranked[:5]]
    rows = [[label, c, times[c], nbytes / times[c] / 1e6] for c in show]
    picks = {"old": min(old, key=times.get), "default": "gemv", "best": ranked[0]}
    return rows, picks


def step_us(fp8: bool, picks: dict[str, str]) -> float:
    """The 128 linears of a 32-layer step (distinct weights) in one graph, each shape's pick."""
    layers = [{nm: weights(n, k, fp8, 1)[0] for nm, (n, k) in LLAMA.items()}
              for _ in range(LAYERS)]
    xs = {nm: torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
          for nm, (n, k) in LLAMA.items()}
    t = graph_us(lambda: [decode_gemm._run(picks[nm], xs[nm], w, s, None)
                          for layer in layers for nm, (w, s) in layer.items()])
    layers.clear()
    torch.cuda.empty_cache()
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=min(14, os.cpu_count() or 1))
    ap.add_argument("--table", default=None, help="write the best pick per shape here (JSON)")
    a = ap.parse_args()
    warm_all(a.jobs)
    rows, steps, table = [], [], {}
    for fp8 in (False, True):
        dt = "fp8" if fp8 else "bf16"
        picks = {}
        for nm, (n, k) in LLAMA.items():
            r, picks[nm] = sweep_shape(f"{nm} {dt}", n, k, fp8)
            rows += r
            table[f"{n},{k},{1 if fp8 else 2}"] = picks[nm]["best"]
            print(*r, sep="\n", flush=True)
        if not fp8:  # the (bf16) lm_head, 4 copies of 1 GB
            r, pick = sweep_shape("lm_head bf16", 128256, 4096, False, count=4)
            rows += r
            table["128256,4096,2"] = pick["best"]
            print(*r, sep="\n", flush=True)
        step_bytes = sum(n * k for n, k in LLAMA.values()) * LAYERS * (1 if fp8 else 2)
        for label in ("old", "default", "best"):
            chosen = {nm: p[label] for nm, p in picks.items()}
            t = step_us(fp8, chosen)
            steps.append([f"{dt} {label}", " ".join(f"{nm}={c}" for nm, c in chosen.items()),
                          t, step_bytes / t / 1e6])
            print(steps[-1], flush=True)
    if a.table:
        with open(a.table, "w") as f:
            json.dump(table, f, indent=1)
    print_table("one shape, 32 distinct weights in a CUDA graph (us per matrix, GB/s)",
                ["shape", "candidate (gemv:BLOCK_N,BLOCK_K bytes,warps)", "us",
                 "GB/s"], rows)
    print_table("32 layers x 4 linears in one CUDA graph (us per step)",
                ["weights / picks", "picks", "us", "GB/s"], steps)


if __name__ == "__main__":
    main()

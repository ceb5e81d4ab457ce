"""An RMSNorm folded into the batch-1 matrix-vector product (``gemv(norm=...)``, used by
layers/gemv_fusion.py for qkv and gate_up) against the separate norm kernel + the product, at
Llama-3.1-8B shapes, bf16 and fp8 weights: 32 distinct weights of a shape back to back in a
CUDA graph (as sweep_gemv.py times), each with its own input row. Every tile of sweep_gemv.py
for the fused kernel; the separate pair with the default tile. Writes the best per shape
(``"norm:N,K,element bytes": tile or "off"``) as a ``SGDSL_DECODE_GEMM_TABLE`` file."""
from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor

import torch
from common import print_table
from sgdsl.runtime.kernels.gemv import gemv
from sgdsl.runtime.kernels.rmsnorm import rmsnorm
from sweep_gemv import LAYERS, graph_us, name, tiles, weights

SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096)}
EPS = 1e-5


def _warm(args: tuple) -> int:
    dtype_name, chunk = args
    w = torch.randn(4096, 4096, device="cuda").to(getattr(torch, dtype_name))
    s = torch.ones(4096, device="cuda") if dtype_name.startswith("float8") else None
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    nw = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    for tile in chunk:
        gemv(x, w, s, tile, norm=(nw, EPS))
    torch.cuda.synchronize()
    return len(chunk)


def warm_all(jobs: int) -> None:
    import multiprocessing as mp

    work = [(dt, tiles()[i::jobs]) for dt in ("bfloat16", "float8_e4m3fn") for i in range(jobs)]
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        print("compiled", sum(pool.map(_warm, work)), "fused tiles", flush=True)


def sweep_shape(label: str, n: int, k: int, fp8: bool) -> tuple[list, str]:
    ws = weights(n, k, fp8, LAYERS)
    xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in ws]
    nws = [torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5 for _ in ws]
    nbytes = n * k * ws[0][0].element_size()
    times = {"separate": graph_us(lambda: [gemv(rmsnorm(x, nw, EPS), w, s)
                                           for x, nw, (w, s) in zip(xs, nws, ws)]) / LAYERS}
    for t in tiles():
        times[name(t)] = graph_us(lambda t=t: [gemv(x, w, s, t, norm=(nw, EPS))
                                               for x, nw, (w, s) in zip(xs, nws, ws)]) / LAYERS
    ws.clear()
    torch.cuda.empty_cache()
    ranked = sorted(times, key=times.get)
    show = ranked[:6] + (["separate"] if "separate" not in ranked[:6] else [])
    rows = [[label, c, times[c], nbytes / times[c] / 1e6] for c in show]
    return rows, "off" if ranked[0] == "separate" else ranked[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=min(14, os.cpu_count() or 1))
    ap.add_argument("--table", default=None, help="write the pick per shape here (JSON)")
    a = ap.parse_args()
    warm_all(a.jobs)
    rows, table = [], {}
    for fp8 in (False, True):
        for nm, (n, k) in SHAPES.items():
            r, pick = sweep_shape(f"{nm} {'fp8' if fp8 else 'bf16'}", n, k, fp8)
            rows += r
            table[f"norm:{n},{k},{1 if fp8 else 2}"] = pick
            print(*r, sep="\n", flush=True)
    if a.table:
        with open(a.table, "w") as f:
            json.dump(table, f, indent=1)
    print(json.dumps(table))
    print_table("norm + product, 32 distinct weights in a CUDA graph (us per matrix incl. the "
                "norm, GB/s of weights)", ["shape", "fused tile / separate", "us", "GB/s"], rows)


if __name__ == "__main__":
    main()

"""The batch-1 products with a paired-row epilogue (kernels/gemv_pairs.py, used by
layers/gemv_epilogue.py) against the separate kernels they replace, at Llama-3.1-8B shapes,
bf16 and fp8 weights: qkv + rotary + KV store (``gemv_rope`` vs ``gemv`` + ``qk_norm_rope``)
and gate_up + SiLU-and-mul (``gemv_silu`` vs ``gemv`` + ``silu_and_mul``), 32 distinct
weights of a shape back to back in a CUDA graph (as sweep_gemv.py times), each with its own
input row. A few pair tiles per element size. Writes the best tile per shape (``"pairs:N,K,
element bytes": "gemv:PAIRS,BLOCK_K bytes,warps"``) as a ``SGDSL_DECODE_GEMM_TABLE`` file."""
from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor

import torch
from common import print_table
from sgdsl.runtime.kernels.activation import silu_and_mul
from sgdsl.runtime.kernels.gemv import gemv
from sgdsl.runtime.kernels.gemv_pairs import default_pair_tile, gemv_rope, gemv_silu
from sgdsl.runtime.kernels.qk_norm_rope import qk_norm_rope
from sgdsl.runtime.layers.attention.base import KVStoreTarget
from sweep_gemv import LAYERS, graph_us, name, weights

SHAPES = {"qkv": (6144, 4096), "gate_up": (28672, 4096)}
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
TILES = {1: [(1, 1024, 1), (1, 2048, 1), (1, 2048, 2), (2, 1024, 2), (1, 512, 1)],
         2: [(1, 2048, 4), (1, 2048, 2), (1, 1024, 2), (2, 2048, 4), (1, 4096, 8)]}


class Rope:
    """One token's cos/sin and a KV pool slot to store into."""

    def __init__(self) -> None:
        ang = torch.rand(HEAD_DIM // 2, device="cuda") * 6
        self.cos = torch.cat([ang.cos(), ang.cos()]).view(1, 1, -1).bfloat16()
        self.sin = torch.cat([-ang.sin(), ang.sin()]).view(1, 1, -1).bfloat16()
        buf = lambda: torch.zeros(64, KV_HEADS, HEAD_DIM, device="cuda",  # noqa: E731
                                  dtype=torch.bfloat16)
        self.store = KVStoreTarget(buf(), buf(), torch.tensor([5], device="cuda"), 1.0, 1.0)


def fused(nm: str, x: torch.Tensor, w: torch.Tensor, s, tile, rope: Rope) -> torch.Tensor:
    if nm == "qkv":
        return gemv_rope(x, w, s, HEADS, KV_HEADS, rope.cos, rope.sin, rope.store, tile)
    return gemv_silu(x, w, s, tile)


def separate(nm: str, x: torch.Tensor, w: torch.Tensor, s, rope: Rope) -> torch.Tensor:
    y = gemv(x, w, s)  # the default one-row tile, as decode_linear runs it
    if nm == "qkv":
        return qk_norm_rope(y.view(1, -1, HEAD_DIM), None, None, HEADS, 0.0, rope.cos,
                            rope.sin, store=rope.store)
    return silu_and_mul(y)


def _warm(args: tuple) -> int:
    fp8, nm = args
    n, k = SHAPES[nm]
    w, s = weights(n, k, fp8, 1)[0]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    rope = Rope()
    separate(nm, x, w, s, rope)
    for tile in TILES[1 if fp8 else 2]:
        fused(nm, x, w, s, tile, rope)
    torch.cuda.synchronize()
    return len(TILES[1 if fp8 else 2])


def warm_all(jobs: int) -> None:
    import multiprocessing as mp

    work = [(fp8, nm) for fp8 in (False, True) for nm in SHAPES]
    with ProcessPoolExecutor(min(jobs, len(work)), mp_context=mp.get_context("spawn")) as pool:
        print("compiled", sum(pool.map(_warm, work)), "pair tiles", flush=True)


def sweep_shape(nm: str, fp8: bool) -> tuple[list, str]:
    n, k = SHAPES[nm]
    ws = weights(n, k, fp8, LAYERS)
    xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in ws]
    rope = Rope()
    nbytes = n * k * ws[0][0].element_size()
    times = {"separate": graph_us(lambda: [separate(nm, x, w, s, rope)
                                           for x, (w, s) in zip(xs, ws)]) / LAYERS}
    for t in TILES[1 if fp8 else 2]:
        times[name(t)] = graph_us(lambda t=t: [fused(nm, x, w, s, t, rope)
                                               for x, (w, s) in zip(xs, ws)]) / LAYERS
    ws.clear()
    torch.cuda.empty_cache()
    label = f"{nm} {'fp8' if fp8 else 'bf16'}"
    default = name(default_pair_tile(n, 1 if fp8 else 2))
    rows = [[label, c + (" (default)" if c == default else ""), times[c],
             nbytes / times[c] / 1e6] for c in sorted(times, key=times.get)]
    best = min((c for c in times if c != "separate"), key=times.get)
    return rows, best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--table", default=None, help="write the best pair tile per shape (JSON)")
    a = ap.parse_args()
    warm_all(a.jobs)
    rows, table = [], {}
    for fp8 in (True, False):
        for nm, (n, k) in SHAPES.items():
            r, best = sweep_shape(nm, fp8)
            rows += r
            table[f"pairs:{n},{k},{1 if fp8 else 2}"] = best
            print(*r, sep="\n", flush=True)
    if a.table:
        with open(a.table, "w") as f:
            json.dump(table, f, indent=1)
    print(json.dumps(table))
    print_table("product + epilogue vs separate kernels, 32 distinct weights in a CUDA graph "
                "(us per layer incl. the epilogue's work, GB/s of weights)",
                ["shape", "pair tile / separate", "us", "GB/s"], rows)


if __name__ == "__main__":
    main()

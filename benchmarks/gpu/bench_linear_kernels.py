"""Decode-shaped GEMMs and MoE layers: achieved weight bandwidth of each path at batch 1
(and a few rows), in CUDA graphs (``do_bench_cudagraph``) so launch gaps do not count.

Dense (Llama-3.1-8B shapes): bf16 ``F.linear`` (cuBLAS), the same through the Triton skinny
GEMM, fp8 weight-only Triton GEMM, fp8
per-token activation quant + ``torch._scaled_mm``. MoE: the fused Triton MoE layer at
Qwen3-30B-A3B (bf16) and Mixtral-8x7B (fp8) shapes, bytes = the chosen experts' weights."""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from common import print_table
from sgdsl.runtime.kernels.fp8_matmul import per_token_quant, w8a16_matmul
from sgdsl.runtime.kernels.fused_moe import fused_moe
from sgdsl.runtime.layers.moe.router import select_experts
from sgdsl.runtime.layers.quantization.fp8_utils import quantize_rows

LLAMA = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
         "down": (4096, 14336), "lm_head": (128256, 4096)}


def _us(fn) -> float:
    return do_bench_cudagraph(fn, rep=50) * 1e3


def dense_rows(m: int) -> list[list]:
    rows = []
    for name, (n, k) in LLAMA.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        q, s = quantize_rows(w)
        t_bf16 = _us(lambda: F.linear(x, w))
        t_tri = _us(lambda: w8a16_matmul(x, w, None))
        t_w8 = _us(lambda: w8a16_matmul(x, q, s))

        def scaled() -> torch.Tensor:
            xq, xs = per_token_quant(x)
            return torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=s.view(1, -1),
                                    out_dtype=torch.bfloat16)

        t_mm = _us(scaled)
        rows.append([f"{name} [{n}x{k}] m={m}", t_bf16, 2 * n * k / t_bf16 / 1e3,
                     2 * n * k / t_tri / 1e3, t_w8, n * k / t_w8 / 1e3, t_mm,
                     n * k / t_mm / 1e3])
        del w, q
    return rows


def moe_row(name: str, experts: int, top_k: int, hidden: int, inter: int, tokens: int,
            fp8: bool) -> list:
    w13 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) * 0.02
    s13 = s2 = None
    if fp8:
        q13, s13 = quantize_rows(w13.view(-1, hidden))
        q2, s2 = quantize_rows(w2.view(-1, inter))
        w13, w2 = q13.view(w13.shape), q2.view(w2.shape)
        s13, s2 = s13.view(experts, 2 * inter), s2.view(experts, hidden)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    weights, ids = select_experts(torch.randn(tokens, experts, device="cuda"), top_k, True)
    t = _us(lambda: fused_moe(x, w13, w2, weights, ids, s13, s2))
    chosen = int(torch.unique(ids).numel())
    nbytes = chosen * 3 * hidden * inter * w13.element_size()
    return [f"{name} T={tokens} ({chosen} experts)", t, nbytes / t / 1e3]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8")
    a = ap.parse_args()
    rows = []
    for m in map(int, a.rows.split(",")):
        rows += dense_rows(m)
    print_table("dense decode GEMMs (us, GB/s of weights)",
                ["shape", "bf16 cuBLAS us", "GB/s", "bf16 Triton GB/s", "fp8 w-only us", "GB/s",
                 "fp8 scaled_mm us", "GB/s"], rows)
    moe = [moe_row("qwen3-30b-a3b bf16", 128, 8, 2048, 768, 1, False),
           moe_row("qwen3-30b-a3b bf16", 128, 8, 2048, 768, 8, False),
           moe_row("mixtral-8x7b fp8", 8, 2, 4096, 14336, 1, True),
           moe_row("mixtral-8x7b fp8", 8, 2, 4096, 14336, 8, True)]
    print_table("fused MoE layer (us, GB/s of chosen experts' weights)",
                ["shape", "us", "GB/s"], moe)


if __name__ == "__main__":
    main()

"""Programmatic dependent launch (runtime/kernels/pdl.py) on one GPU: the kernels of a batch-1
decode step of Llama-3.1-8B at one TP rank's shapes, 32 layers with distinct weights and KV
buffers, captured in a CUDA graph, replayed with PDL off and on in the same process.

Per layer, as the TP chain runs them (model/llama.py, chained sums): add + RMSNorm (standing
for the all-reduce fused with them: one GPU has no peers), qkv + rotary + KV store
(gemv_rope), decode attention (two kernels), o_proj (gemv), add + RMSNorm, gate_up + SiLU
(gemv_silu), down (gemv): 8 launches, 256 per step. Also the step's weights-read floor at the
card's copy bandwidth, so the fixed per-kernel cost left is visible:

    python bench_pdl_chain.py --tp 4      # ~1 min; --tp 1 2 4 8 in one run: --tp 1,4
"""
from __future__ import annotations

import argparse

import torch

from bench_tp import copy_tb_s
from common import device_line, print_table, replay_us
from sgdsl.runtime.kernels import pdl
from sgdsl.runtime.kernels.decode_attention import decode_attention_fwd
from sgdsl.runtime.kernels.gemv import gemv
from sgdsl.runtime.kernels.gemv_pairs import gemv_rope, gemv_silu
from sgdsl.runtime.kernels.rmsnorm import fused_add_rmsnorm
from sgdsl.runtime.layers.attention.base import KVStoreTarget

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 4096, 14336, 32, 8, 128, 32
BF = torch.bfloat16
DEV = "cuda"


def build(tp: int, ctx: int) -> dict:
    """Weights and buffers of 32 layers at TP=tp (one rank's shards), ``ctx`` tokens cached."""
    qh, kvh = HEADS // tp, max(KV_HEADS // tp, 1)
    inter = INTER // tp
    w = lambda n, k: torch.randn(n, k, device=DEV, dtype=BF) * k ** -0.5  # noqa: E731
    layers = [dict(qkv=w((qh + 2 * kvh) * HEAD_DIM, HIDDEN), o=w(HIDDEN, qh * HEAD_DIM),
                   gate_up=w(2 * inter, HIDDEN), down=w(HIDDEN, inter),
                   k=torch.randn(ctx + 8, kvh, HEAD_DIM, device=DEV, dtype=BF),
                   v=torch.randn(ctx + 8, kvh, HEAD_DIM, device=DEV, dtype=BF))
              for _ in range(LAYERS)]
    splits = 16
    return dict(layers=layers, qh=qh, kvh=kvh, splits=splits,
                ln=torch.rand(HIDDEN, device=DEV, dtype=BF) + 0.5,
                x=torch.randn(1, HIDDEN, device=DEV, dtype=BF),
                res=torch.randn(1, HIDDEN, device=DEV, dtype=BF),
                cos=torch.rand(1, 1, HEAD_DIM, device=DEV, dtype=BF),
                sin=torch.rand(1, 1, HEAD_DIM, device=DEV, dtype=BF),
                loc=torch.tensor([ctx], device=DEV),
                r2t=torch.arange(ctx + 8, device=DEV, dtype=torch.int32).view(1, -1),
                req=torch.zeros(1, device=DEV, dtype=torch.int64),
                lens=torch.tensor([ctx + 1], device=DEV),
                mid_o=torch.empty(1, qh, splits, HEAD_DIM, device=DEV),
                mid_lse=torch.empty(1, qh, splits, device=DEV))


def step(m: dict) -> torch.Tensor:
    h, res = m["x"], m["res"].clone()
    qh, kvh = m["qh"], m["kvh"]
    for layer in m["layers"]:
        xn, res = fused_add_rmsnorm(h, res, m["ln"], 1e-5, inplace=False)
        store = KVStoreTarget(layer["k"], layer["v"], m["loc"], 1.0, 1.0)
        qkv = gemv_rope(xn, layer["qkv"], None, qh, kvh, m["cos"], m["sin"], store)
        q = qkv[:, :qh * HEAD_DIM].view(1, qh, HEAD_DIM)
        attn = torch.empty_like(q)
        decode_attention_fwd(q, layer["k"], layer["v"], attn, m["r2t"], m["req"], m["lens"],
                             None, m["mid_o"], m["mid_lse"], HEAD_DIM ** -0.5, m["splits"],
                             min_tokens_per_split=32)
        o = gemv(attn.view(1, -1), layer["o"])
        xn, res = fused_add_rmsnorm(o, res, m["ln"], 1e-5, inplace=False)
        h = gemv(gemv_silu(xn, layer["gate_up"]), layer["down"])
    return h


def graph_us(m: dict, on: bool, replays: int = 20) -> tuple[float, torch.Tensor]:
    """Median us of one replay with PDL ``on``, and the step's output."""
    pdl.set_enabled(on)
    step(m)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(m)
    pdl.set_enabled(None)
    return replay_us(g, 3, replays), out.clone()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", default="4", help="comma-separated TP sizes (one rank's shapes)")
    ap.add_argument("--ctx", type=int, default=512, help="tokens in the KV cache")
    a = ap.parse_args()
    dev = torch.cuda.current_device()
    assert pdl.supported(dev), "no PDL here (compute capability < 9.0 or an older Triton)"
    bw = copy_tb_s()
    print(device_line(), f"| copy {bw:.2f} TB/s", flush=True)
    rows = []
    for tp in (int(t) for t in a.tp.split(",")):
        m = build(tp, a.ctx)
        weight_bytes = sum(t.numel() * 2 for layer in m["layers"]
                           for name, t in layer.items() if name not in ("k", "v"))
        floor = weight_bytes / (bw * 1e12) * 1e6
        (off, ref), (on, got) = graph_us(m, False), graph_us(m, True)
        assert torch.equal(ref, got), "PDL changed the step's output"
        launches = 8 * LAYERS
        rows.append([f"8B TP={tp} rank, {LAYERS} layers", launches, floor, off, on, off / on,
                     (off - on) / launches, (off - floor) / launches, (on - floor) / launches])
        print(rows[-1], flush=True)
        del m
        torch.cuda.empty_cache()
    print_table("Batch-1 decode kernels in a CUDA graph, PDL off vs on (same bits checked)",
                ["chain", "launches", "weights floor us", "off us", "on us", "off / on",
                 "saved us / launch", "over floor us / launch, off", "on"], rows)


if __name__ == "__main__":
    main()

"""The greedy argmax of one batch-1 decode step (Llama-3 vocabulary, fp32 logits) in a CUDA
graph: torch's one-step argmax against sampler.greedy_argmax (per-chunk max, then the best
chunk). Prints us per call (median of graph replays, 20 calls per replay)."""
from __future__ import annotations

import torch
from sgdsl.runtime.layers.sampler import greedy_argmax
from sweep_gemv import graph_us

for bs in (1, 4):
    logits = torch.randn(bs, 128256, device="cuda")
    one = graph_us(lambda x=logits: [x.argmax(dim=-1) for _ in range(20)]) / 20
    two = graph_us(lambda x=logits: [greedy_argmax(x) for _ in range(20)]) / 20
    assert torch.equal(greedy_argmax(logits), logits.argmax(dim=-1))
    print(f"argmax bs={bs} vocab=128256: torch {one:.2f} us, two-step {two:.2f} us", flush=True)

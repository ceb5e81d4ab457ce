"""Microbenchmark of the attention kernels at Llama-3.1-8B shapes (32 q heads, 8 kv heads,
head_dim 128, bf16): decode attention as achieved KV bandwidth, extend attention as TFLOP/s,
and workload D's decode step (128 requests, 8 groups of 16 sharing a 2048-token prefix) with
plain split-K vs cascade (shared prefix read once per tile), through the triton backend."""
from __future__ import annotations

import torch
import triton

from common import print_table
from sgdsl.runtime.kernels.decode_attention import decode_attention_fwd, num_kv_splits_for
from sgdsl.runtime.kernels.extend_attention import extend_attention_fwd
from sgdsl.runtime.layers.attention.triton import MIN_TOKENS_PER_SPLIT, splits_cap

H, KVH, D = 32, 8, 128


def _pool(bs: int, ctx: int):
    slots = bs * ctx + 1
    k = torch.randn(slots, KVH, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    r2t = (torch.randperm(slots - 1, device="cuda")[: bs * ctx] + 1).view(bs, ctx)
    return k, v, r2t


def bench_decode(bs: int, ctx: int) -> list:
    k, v, r2t = _pool(bs, ctx)
    q = torch.randn(bs, H, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    rows = torch.arange(bs, device="cuda")
    sl = torch.full((bs,), ctx, device="cuda")
    cap = splits_cap(bs, KVH, torch.cuda.get_device_properties(0).multi_processor_count)
    splits = num_kv_splits_for(sl, cap, MIN_TOKENS_PER_SPLIT)
    mid_o = torch.empty(bs, H, 16, D, dtype=torch.float32, device="cuda")
    mid_lse = torch.empty(bs, H, 16, dtype=torch.float32, device="cuda")
    fn = lambda: decode_attention_fwd(q, k, v, out, r2t, rows, sl, splits, mid_o, mid_lse,  # noqa
                                      D ** -0.5, cap)
    ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
    gb = 2 * bs * ctx * KVH * D * 2 / 1e9
    return [f"decode bs={bs} ctx={ctx}", ms * 1e3, gb / (ms / 1e3), "GB/s"]


def bench_extend(bs: int, prefix: int, new: int) -> list:
    k_buf, v_buf, r2t = _pool(bs, prefix + new)
    t = bs * new
    q = torch.randn(t, H, D, dtype=torch.bfloat16, device="cuda")
    kn, vn = (torch.randn(t, KVH, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out = torch.empty_like(q)
    rows = torch.arange(bs, device="cuda")
    pl = torch.full((bs,), prefix, device="cuda")
    el = torch.full((bs,), new, device="cuda")
    start = torch.arange(bs, device="cuda") * new
    fn = lambda: extend_attention_fwd(q, kn, vn, out, k_buf, v_buf, r2t, rows, pl, el, start,  # noqa
                                      new, D ** -0.5)
    ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
    flops = 4 * bs * H * D * new * (prefix + new / 2)
    return [f"extend bs={bs} prefix={prefix} new={new}", ms * 1e3, flops / (ms / 1e3) / 1e12,
            "TFLOP/s"]


def bench_shared_prefix(groups: int, members: int, prefix: int, own: int) -> list[list]:
    """One layer's decode attention over D-shaped shared prefixes, plain vs cascade."""
    from types import SimpleNamespace

    from sgdsl.runtime.layers.attention.shared_prefix import build_shared_prefix
    from sgdsl.runtime.layers.attention.triton import TritonAttnBackend
    from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode

    bs, ctx = groups * members, prefix + own
    k, v, r2t = _pool(bs, ctx)
    for g in range(groups):  # members of a group point at one copy of the prefix
        r2t[g * members:(g + 1) * members, :prefix] = r2t[g * members, :prefix]
    pool = SimpleNamespace(k_buffer=[k], v_buffer=[v])
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=r2t),
                             token_kv_pool=pool, model_config=SimpleNamespace(num_heads=H,
                                                                              head_dim=D))
    backend = TritonAttnBackend(runner)
    i64 = dict(dtype=torch.int64, device="cuda")
    sl = torch.full((bs,), ctx, **i64)
    shared = build_shared_prefix(
        [(g * members, prefix, list(range(g * members, (g + 1) * members)))
         for g in range(groups)], bs, backend.prefix_members, torch.device("cuda"))
    q = torch.randn(bs, H, D, dtype=torch.bfloat16, device="cuda")
    kv_new = torch.randn(bs, KVH, D, dtype=torch.bfloat16, device="cuda")
    rows = []
    for name, sp in (("plain", None), ("cascade", shared)):
        batch = ForwardBatch(ForwardMode.DECODE, bs, sl, sl - 1, torch.arange(bs, **i64), sl,
                             torch.zeros(bs, **i64), sl - 1, torch.ones(bs, **i64),
                             torch.arange(bs, **i64), shared_prefix=sp)
        backend.init_forward_metadata(batch)
        fn = lambda: backend.forward(q, kv_new, kv_new, 0, batch, D ** -0.5)  # noqa: E731
        ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
        rows.append([f"D decode {name}: {groups}x{members} reqs, {prefix}+{own} ctx", ms * 1e3,
                     "", "us/layer"])
    return rows


def bench_decode_batch1(ctx: int, block_n: int, min_tokens: int, mode: str = "tensor") -> list:
    """One layer's batch-1 decode attention (stage 1 + merge) in a CUDA graph: the split size
    and keys per iteration of stage 1 (the runtime: 32 and 32). ``mode``: ``tensor`` (split
    counts from ``num_kv_splits_for``'s tensor ops in the graph, as the runtime did once per
    step before 2026-11-26) or ``kernel`` (counted in stage 1). NOTE: a third mode, merged in
    stage 1 by the last split program (no stage-2 launch), took 8.3-8.4 us against 5.4 us
    (H100, 2026-11-26) and was dropped."""
    k, v, r2t = _pool(1, ctx)
    q = torch.randn(1, H, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    rows, sl = torch.zeros(1, dtype=torch.int64, device="cuda"), torch.full((1,), ctx, device="cuda")
    cap = splits_cap(1, KVH, torch.cuda.get_device_properties(0).multi_processor_count)
    mid_o = torch.empty(1, H, 16, D, dtype=torch.float32, device="cuda")
    mid_lse = torch.empty(1, H, 16, dtype=torch.float32, device="cuda")

    def fn():  # the split counts inside the graph, as the runtime computed them per step
        splits = num_kv_splits_for(sl, cap, min_tokens) if mode == "tensor" else None
        decode_attention_fwd(q, k, v, out, r2t, rows, sl, splits, mid_o, mid_lse, D ** -0.5,
                             cap, block_n=block_n, min_tokens_per_split=min_tokens)
    us = triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3
    return [f"decode bs=1 ctx={ctx} split>={min_tokens} keys/iter={block_n} {mode}", us, "", "us"]


def main() -> None:
    import sys

    if "--batch1" in sys.argv:
        rows = [bench_decode_batch1(ctx, 32, 32, mode) for ctx in (160, 256, 384)
                for mode in ("tensor", "kernel")]
        print_table("batch-1 decode attention, Llama-3.1-8B shapes, bf16",
                    ["case", "us", "", "unit"], rows)
        return
    rows = bench_shared_prefix(8, 16, 2048, 192)
    rows += [bench_decode(bs, ctx) for bs, ctx in ((1, 384), (1, 4096), (32, 1024), (128, 1280))]
    rows += [bench_extend(bs, p, n) for bs, p, n in ((1, 0, 1024), (8, 0, 1024), (16, 2048, 128))]
    print_table("attention kernels, Llama-3.1-8B shapes, bf16", ["case", "us", "rate", "unit"],
                rows)


if __name__ == "__main__":
    main()

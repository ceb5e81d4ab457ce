"""The Qwen2.5-VL-7B vision tower alone (dummy bf16 weights at the real config), this tree's
path against the previous one, variant by variant, and the tower's GEMMs one by one.

Variants (the same module and weights; each old piece put back by patching it in):
- ``this tree``: varlen flash attention over the windows' / frames' cu_seqlens, the MLP
  zero-padded to 3456 with gate and up as one GEMM + fused silu_and_mul;
- ``per-length SDPA``: attention as before (q/k/v gathered by window length, one SDPA call per
  length, scattered back);
- ``unpadded MLP``: gate, up, down at HF's 3420 (leading dims not 16-byte aligned), separate
  silu and product, as before;
- ``previous path``: both;
- ``probe: full layers on cuDNN SDPA`` (GPU only): the four full-attention layers' equal-length
  frames as one batched SDPA call on cuDNN's kernel instead of flash (not in the runtime: a
  measurement for the next step).

Reported: ms per forward, ms per image, TFLOP/s on the weights' FLOPs (as ``bench_vlm
--profile`` reports the encoder), and the projection to workload A's 256 images. GEMM rows:
the tower's GEMMs at the forward's row count, aligned and not.

GPU: ``python3 benchmarks/gpu/bench_vision_tower.py [--images 8] [--profile]``
CPU smoke: ``python3 benchmarks/gpu/bench_vision_tower.py --device cpu --tiny``
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from common import device_line, print_table

CONFIG = Path(__file__).resolve().parent / "configs" / "qwen2.5-vl-7b" / "config.json"
TINY = dict(depth=2, hidden_size=64, intermediate_size=120, num_heads=2, out_hidden_size=64,
            window_size=112, fullatt_block_indexes=[1])


def vision_config(tiny: bool) -> SimpleNamespace:
    raw = json.loads(CONFIG.read_text())["vision_config"]
    raw.setdefault("in_channels", raw.get("in_chans", 3))
    if tiny:
        raw.update(TINY)
    return SimpleNamespace(**raw)


def build(cfg: SimpleNamespace, device: str, dtype: torch.dtype):
    from sgdsl.runtime.model.qwen2_5_vl_vision import Qwen2_5_VisionTransformer

    torch.manual_seed(0)
    with torch.device(device):
        tower = Qwen2_5_VisionTransformer(cfg).to(dtype).eval()
    with torch.no_grad():
        for name, p in tower.named_parameters():
            p.fill_(1.0) if "norm" in name or "ln_q" in name else p.normal_(0.0, 0.02)
    return tower


def unpadded_mlp(tower) -> dict:
    """Contiguous HF-shaped copies of each MLP's weights (the previous layout)."""
    return {id(b.mlp): [t.detach().contiguous().clone() for t in (
        b.mlp.gate_proj.weight, b.mlp.gate_proj.bias, b.mlp.up_proj.weight, b.mlp.up_proj.bias,
        b.mlp.down_proj.weight, b.mlp.down_proj.bias)] for b in tower.blocks}


def cudnn_frames(base):
    """``segment_attention`` with equal-length frames (the full-attention layers) as one
    batched SDPA call on cuDNN's kernel (a probe for a next step; windows as ``base``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attend(q, k, v, segs, scale):
        length = segs.max_len
        if segs.cu is None or length < 1024 or length * (segs.cu.numel() - 1) != q.shape[0]:
            return base(q, k, v, segs, scale)
        qg, kg, vg = (t.reshape(-1, length, *t.shape[1:]).transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qg, kg, vg, scale=scale)
        return out.transpose(1, 2).reshape(q.shape)
    return attend


def patched(varlen: bool, padded: bool, plain: dict, cudnn: bool = False):
    """Context: the tower's attention and MLP as in the variant."""
    import contextlib

    from sgdsl.runtime.model import qwen2_5_vl_vision as vis
    from sgdsl.runtime.model.vision_mlp import VisionMLP

    def old_mlp(self, x):
        gw, gb, uw, ub, dw, db = plain[id(self)]
        return F.linear(self.act(F.linear(x, gw, gb)) * F.linear(x, uw, ub), dw, db)

    @contextlib.contextmanager
    def ctx():
        saved = vis.varlen_supported, VisionMLP.forward, vis.segment_attention
        if not varlen:
            vis.varlen_supported = lambda *a: False
        if not padded:
            VisionMLP.forward = old_mlp
        if cudnn:
            vis.segment_attention = cudnn_frames(vis.segment_attention)
        try:
            yield
        finally:
            vis.varlen_supported, VisionMLP.forward, vis.segment_attention = saved
    return ctx()


def time_ms(fn, device: str, iters: int) -> float:
    fn()  # warm-up (Triton compiles, cuBLAS heuristics)
    if device != "cuda":
        import time

        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters * 1e3
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def weight_flops(cfg: SimpleNamespace, patches: int) -> float:
    h, inter, unit = cfg.hidden_size, cfg.intermediate_size, cfg.spatial_merge_size ** 2
    merged = h * unit
    merger = merged * merged + merged * cfg.out_hidden_size
    per_patch = cfg.depth * (4 * h * h + 3 * h * inter) + merger / unit
    return 2.0 * per_patch * patches


def gemm_rows(cfg: SimpleNamespace, m: int, device: str, dtype: torch.dtype, iters: int) -> list:
    h, inter = cfg.hidden_size, cfg.intermediate_size
    pad = -(-inter // 64) * 64
    x = torch.randn(m, h, device=device, dtype=dtype)
    cases = [("qkv", h, 3 * h), ("attn proj", h, h), ("gate or up, N=I (previous, x2)", h, inter),
             ("gate+up, N=2P (this tree)", h, 2 * pad), ("down, K=I (previous)", inter, h),
             ("down, K=P (this tree)", pad, h)]
    rows = []
    for name, k, n in cases:
        a = x if k == h else torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype) * 0.02
        b = torch.zeros(n, device=device, dtype=dtype)
        ms = time_ms(lambda: F.linear(a, w, b), device, iters)
        rows.append([name, f"{m}x{k}x{n}", ms, 2.0 * m * k * n / ms / 1e9])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=8, help="1280x720 images per forward")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny dims (CPU smoke)")
    ap.add_argument("--profile", action="store_true", help="kernel table of one forward")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    cfg = vision_config(args.tiny)
    tower = build(cfg, args.device, dtype)
    plain = unpadded_mlp(tower)
    grid = (1, 52, 92)  # 1280x720 -> 728x1288 pixels -> 52x92 patches (smart_resize)
    grids = [grid] * args.images
    patches = args.images * grid[1] * grid[2]
    cin = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    pixels = torch.randn(patches, cin, device=args.device, dtype=dtype)
    flops = weight_flops(cfg, patches)
    rows, outs = [], {}
    variants = [("this tree", True, True, False), ("per-length SDPA", False, True, False),
                ("unpadded MLP", True, False, False), ("previous path", False, False, False)]
    if args.device == "cuda":
        variants.append(("probe: full layers on cuDNN SDPA", True, True, True))
    for name, varlen, padded, cudnn in variants:
        try:
            with torch.inference_mode(), patched(varlen, padded, plain, cudnn):
                ms = time_ms(lambda: tower(pixels, grids), args.device, args.iters)
                outs[name] = tower(pixels, grids).float()
        except RuntimeError as exc:  # the probe's backend may be missing: say so, go on
            rows.append([name, f"n/a: {str(exc)[:60]}", "", "", "", ""])
            continue
        ref = outs["this tree"]
        diff = float((outs[name] - ref).abs().max() / ref.abs().max())
        rows.append([name, ms, ms / args.images, flops / ms / 1e9, 256 * ms / args.images / 1e3,
                     diff])
    print_table(f"Qwen2.5-VL-7B vision tower{' (tiny dims)' if args.tiny else ''}: {args.images} x "
                f"1280x720 ({patches} patches) per forward, {flops / 1e12:.1f} TFLOP of weights",
                ["variant", "ms/forward", "ms/image", "TFLOP/s (weights)", "256 images s",
                 "max rel diff vs this tree"], rows)
    with torch.inference_mode():
        print_table(f"the tower's GEMMs at {patches} rows",
                    ["GEMM (bias epilogue)", "MxKxN", "ms", "TFLOP/s"],
                    gemm_rows(cfg, patches, args.device, dtype, args.iters))
    if args.profile and args.device == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            tower(pixels, grids)
            torch.cuda.synchronize()
        print(f"\n### kernels of one forward (this tree)\n{device_line()}")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=15,
                                        max_name_column_width=60))


if __name__ == "__main__":
    main()

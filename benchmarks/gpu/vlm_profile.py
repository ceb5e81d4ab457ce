"""Where a Qwen2.5-VL run's time goes (``bench_vlm.py --profile``), phase by phase:

- ``preprocess``: the engine's image step alone (decode, pixel hash, the processor's resize;
  ``MultimodalProcessor.process``) over fresh images on as many threads as ``async_generate``'s
  default executor has: its images/s bounds how fast requests can reach the scheduler;
- ``pipe``: one request's ``MmData`` through the IPC serializer (bytes, dumps, loads: the
  loads run on the scheduler's loop);
- ``encoder``: the vision encoder's device time during workload A (CUDA events around each
  call, ``mm_encode_ms`` in the scheduler's stats) and its rate;
- ``text-only``: workload C, the same prompt lengths with no images (the language model's
  prefill + decode alone), so ``A - C`` is what images add;
- ``scheduler``: its step trace (``$SGDSL_STEP_TRACE``, runtime/scheduler/step_trace.py) over
  the whole run (warm-up, A, B, C): host ms by part of the loop (``handle``: taking messages,
  unpickling included; ``_read``: waiting for the device), and the slowest iterations.
"""
from __future__ import annotations

import os
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def preprocess(engine: Any, head: list[int], imgs: list, qs: list[list[int]]) -> dict:
    """The image step over ``imgs`` (not seen before: no processed-pixel cache hits)."""
    proc = engine.mm_processor
    workers = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor
    before = proc.stats()["mm_preprocess_s"]
    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        done = list(pool.map(lambda a: proc.process(head + a[0], [a[1]], "image_data"),
                             zip(qs, imgs)))
        wall = time.perf_counter() - t0
    busy = proc.stats()["mm_preprocess_s"] - before
    mm = done[0][1]
    t0 = time.perf_counter()
    data = pickle.dumps(mm, protocol=pickle.HIGHEST_PROTOCOL)
    dumps = time.perf_counter() - t0
    t0 = time.perf_counter()
    pickle.loads(data)
    loads = time.perf_counter() - t0
    return {"threads": workers, "wall_s": wall, "img_per_s": len(imgs) / wall,
            "busy_ms_per_img": busy / len(imgs) * 1e3, "pipe_mb": len(data) / 1e6,
            "dumps_ms": dumps * 1e3, "loads_ms": loads * 1e3,
            "pixels": f"{tuple(mm.images[0].pixel_values.shape)} "
                      f"{mm.images[0].pixel_values.dtype}"}


def trace_totals(path: str) -> str:
    """Host seconds by part of the scheduler loop, summed over the trace's iterations."""
    import step_trace_report

    rows = step_trace_report.load(path)
    totals: dict[str, float] = {"iterations": 0.0, "handle_ms": 0.0}
    for r in rows:
        totals["iterations"] += r["ms"]
        totals["handle_ms"] += r["handle_ms"]
        for k, v in r.items():
            if k not in step_trace_report.SKIP and isinstance(v, (int, float)):
                totals[k] = totals.get(k, 0.0) + v
    span = rows[-1]["t"] - rows[0]["t"] if rows else 0.0
    parts = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in totals.items() if v >= 1.0)
    return (f"scheduler trace: {len(rows)} iterations over {span:.1f} s; host s by part: {parts}"
            f"\n{step_trace_report.summarize(path, top=6)}")


def vision_params(cfg: Any) -> float:
    """Weights of the Qwen2.5-VL vision tower per patch (the blocks', plus the merger's over
    the merge unit's patches), from its config: 2x this is the weights' FLOPs per patch."""
    h, inter, unit = cfg.hidden_size, cfg.intermediate_size, cfg.spatial_merge_size ** 2
    merged = h * unit
    merger = merged * merged + merged * cfg.out_hidden_size
    return cfg.depth * (4 * h * h + 3 * h * inter) + merger / unit


def report(prof: dict, ours: dict, vision_cfg: Any) -> None:
    pre, a, c = prof["preprocess"], ours["A"], ours.get("C")
    enc_s = a["mm_encode_ms"] / 1e3
    flops = 2 * vision_params(vision_cfg) * a["mm_patches_encoded"]
    print("\n### Where A's time goes (--profile)")
    print("| phase | measure |\n|---|---|")
    print(f"| A (images) wall | {a['wall_s']:.2f} s |")
    print(f"| preprocess alone ({pre['threads']} threads) | {pre['wall_s']:.2f} s for "
          f"{a['requests']} images = {pre['img_per_s']:.0f} img/s; {pre['busy_ms_per_img']:.1f} "
          f"ms per image per thread; pixels {pre['pixels']} |")
    print(f"| preprocess during A (summed over threads) | {a['mm_preprocess_s']:.2f} s |")
    print(f"| pipe, per request | {pre['pipe_mb']:.2f} MB, dumps {pre['dumps_ms']:.2f} ms, "
          f"loads {pre['loads_ms']:.2f} ms (scheduler loop) |")
    print(f"| vision encoder, device time in A | {enc_s:.2f} s for {a['mm_patches_encoded']} "
          f"patches ({flops / max(enc_s, 1e-9) / 1e12:.0f} TFLOP/s on the weights' FLOPs) |")
    print(f"| A's steps | {a['extend_steps']} prefill, {a['forward_steps'] - a['extend_steps']} "
          f"other (decode) |")
    if c is not None:
        print(f"| C: text-only, same prompt lengths (LLM prefill + decode) | {c['wall_s']:.2f} s |")
        print(f"| A - C (what images add) | {a['wall_s'] - c['wall_s']:.2f} s, of which encoder "
              f"{enc_s:.2f} s |")

"""Qwen2.5-VL-7B (dummy bf16 weights) with images: our engine vs Hugging Face ``generate``
(batched), in one run, on the same weights.

Workload A: ``--num`` requests, each one distinct 1280x720 image + a 64-token question,
128 tokens out (greedy, ignore EOS). Workload B: the same questions about ``--distinct``
images (each image asked ``num / distinct`` times): the radix cache (image tokens keyed by the
image's pixel hash) and the encoder cache serve the repeats. HF runs workload A on the first
``--hf-num`` requests in batches of ``--hf-batch`` (its throughput at that batch); HF has no
cache, so its B throughput is its A throughput.

Weights: transformers builds the model at the config with its own random init and saves it
(safetensors) to a work dir; our engine loads that file, HF loads it back, so both run the
same numbers. The carried config dir has the real Qwen2.5-VL-7B-Instruct config and
preprocessor config and the stand-in SmolLM2 tokenizer; the work dir's tokenizer gets the
Qwen vision tokens added and the config's token ids point at them.

GPU: ``python3 benchmarks/gpu/bench_vlm.py`` (after ``source benchmarks/gpu/device_env.sh``;
the device needs the pillow wheel, see fetch_wheels.sh). CPU smoke: ``--tiny``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import vlm_profile

CONFIG = Path(__file__).resolve().parent / "configs" / "qwen2.5-vl-7b"
SPECIALS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TINY_TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0,
                 rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
TINY_VISION = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2,
                   out_hidden_size=64, window_size=56, fullatt_block_indexes=[1])


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_dir(work: Path, tiny: bool, device: str) -> dict[str, int]:
    """The work dir: config, preprocessor, tokenizer (+ vision tokens), HF-initialized weights."""
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    from sgdsl.runtime.multimodal.tokens import add_special_tokens

    for name in ("config.json", "preprocessor_config.json", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(CONFIG / name, work / name)  # follows the tokenizer symlinks
    ids = add_special_tokens(work, SPECIALS)
    raw = json.loads((work / "config.json").read_text())
    raw.update(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
               vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    if tiny:
        raw.update(TINY_TEXT, vocab_size=49160, max_position_embeddings=4096)
        raw["vision_config"].update(TINY_VISION)
    (work / "config.json").write_text(json.dumps(raw, indent=2))
    config = AutoConfig.from_pretrained(str(work))
    dtype = torch.float32 if tiny else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)
    model.save_pretrained(str(work))
    del model
    gc.collect()
    return ids


def make_images(n: int, size: tuple[int, int], seed: int) -> list:
    """Distinct RGB images: random low-resolution colour fields, upsampled."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (9, 16, 3), dtype=np.uint8)).resize(size)
            for _ in range(n)]


def questions(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(200, 40000, (length,), generator=gen).tolist() for _ in range(n)]


async def submit_all(engine, prompts: list[list[int]], imgs: list | None, params: dict) -> list[dict]:
    """One request per (prompt, image), all in flight at once, as a server would get them:
    each is decoded and preprocessed on a worker thread and enters the scheduler when ready
    (``imgs`` None: text-only prompts)."""
    if imgs is None:
        return await asyncio.gather(*(engine.async_generate(input_ids=p, sampling_params=params)
                                      for p in prompts))
    return await asyncio.gather(*(engine.async_generate(input_ids=p, image_data=[i],
                                                        sampling_params=params)
                                  for p, i in zip(prompts, imgs)))


STAT_KEYS = ("cache_hit_tokens", "cache_query_tokens", "mm_images_encoded", "prompt_tokens_total",
             "mm_encode_ms", "mm_patches_encoded", "mm_preprocess_s", "forward_steps",
             "extend_steps")


def run_ours(work: Path, ids: dict[str, int], workloads: dict, out_len: int, tiny: bool,
             prof: dict) -> dict:
    """Workloads A and B (and, profiling, the preprocess alone and the text-only C)."""
    from sgdsl.runtime import Engine

    head = [ids["<|vision_start|>"], ids["<|image_pad|>"], ids["<|vision_end|>"]]
    params = {"max_new_tokens": out_len, "ignore_eos": True, "temperature": 0.0}
    kw = dict(max_total_tokens=16384, num_threads=1) if tiny else dict(
        context_length=4096, chunked_prefill_size=8192, max_prefill_tokens=16384,
        max_running_requests=256, cuda_graph_max_bs=256, mem_fraction_static=0.8)
    results = {}
    with Engine(str(work), grammar_backend="none", **kw) as engine:
        warm_imgs, warm_qs = workloads["warm"]
        engine.generate(input_ids=[head + q for q in warm_qs], sampling_params=params,
                        image_data=[[i] for i in warm_imgs])
        if "pre" in workloads:
            prof["preprocess"] = vlm_profile.preprocess(engine, head, *workloads["pre"])
        for name in [n for n in ("A", "B", "C") if n in workloads]:
            imgs, qs = workloads[name]
            prompts = qs if imgs is None else [head + q for q in qs]
            engine.flush_cache()
            before = engine.stats()
            sync()
            t0 = time.perf_counter()
            outs = asyncio.run(submit_all(engine, prompts, imgs, params))
            sync()
            wall = time.perf_counter() - t0
            time.sleep(0.2)  # the last encoder events complete before the stats read them
            after = engine.stats()
            assert sum(len(o["output_ids"]) for o in outs) == out_len * len(qs)
            delta = {k: after[k] - before[k] for k in STAT_KEYS}
            results[name] = {"wall_s": wall, "requests": len(qs), "out_tokens": out_len * len(qs),
                             **delta}
            print(f"ours {name}: {results[name]}", flush=True)
    return results


def run_hf(work: Path, ids: dict[str, int], imgs: list, qs: list[list[int]], out_len: int,
           batch: int, device: str, tiny: bool) -> dict:
    from transformers import AutoImageProcessor, Qwen2_5_VLForConditionalGeneration

    dtype = torch.float32 if tiny else torch.bfloat16
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(work), dtype=dtype).to(device).eval()
    proc = AutoImageProcessor.from_pretrained(str(work))
    merge = model.config.vision_config.spatial_merge_size
    takes_types = "mm_token_type_ids" in inspect.signature(model.model.forward).parameters

    def one_batch(bi: list, bq: list[list[int]]) -> int:
        pix = proc(images=bi, return_tensors="pt")
        grid = pix["image_grid_thw"]
        rows = [[ids["<|vision_start|>"]] + [ids["<|image_pad|>"]] * int(g.prod() // merge ** 2)
                + [ids["<|vision_end|>"]] + q for g, q in zip(grid, bq)]
        input_ids = torch.tensor(rows, device=device)  # equal lengths: same image size, question
        extra = {}
        if takes_types:  # transformers >= 5.2x places M-RoPE by token type
            extra["mm_token_type_ids"] = (input_ids == ids["<|image_pad|>"]).int()
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             pixel_values=pix["pixel_values"].to(device, dtype),
                             image_grid_thw=grid.to(device), max_new_tokens=out_len,
                             min_new_tokens=out_len, do_sample=False, **extra)
        return int(out.shape[0] * (out.shape[1] - input_ids.shape[1]))

    with torch.inference_mode():
        one_batch(imgs[:2], qs[:2])  # warm-up
        sync()
        t0 = time.perf_counter()
        gen = sum(one_batch(imgs[s:s + batch], qs[s:s + batch]) for s in range(0, len(qs), batch))
        sync()
        wall = time.perf_counter() - t0
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"wall_s": wall, "requests": len(qs), "out_tokens": gen}


def report(ours: dict, hf: dict | None, args: argparse.Namespace) -> None:
    from common import device_line

    print(f"\n## Qwen2.5-VL-7B{' (tiny config, CPU smoke)' if args.tiny else ''}: {args.num} requests x "
          f"(one {args.width}x{args.height} image + {args.question} question tokens), "
          f"{args.out} out\n{device_line()}")
    print("| run | wall s | req/s | out tok/s | images encoded | prefix cache hit | vs HF |")
    print("|---|---|---|---|---|---|---|")
    hf_rate = hf["out_tokens"] / hf["wall_s"] if hf else None
    for name, label in (("A", f"sgdsl, {args.num} distinct images"),
                        ("B", f"sgdsl, {args.distinct} distinct images (x{args.num // args.distinct})")):
        r = ours[name]
        rate = r["out_tokens"] / r["wall_s"]
        hit = r["cache_hit_tokens"] / max(r["cache_query_tokens"], 1)
        ratio = f"{rate / hf_rate:.1f}x" if hf_rate else "-"
        print(f"| {label} | {r['wall_s']:.2f} | {r['requests'] / r['wall_s']:.2f} | {rate:.0f} | "
              f"{r['mm_images_encoded']} | {hit:.1%} | {ratio} |")
    if hf:
        print(f"| HF generate, batch {args.hf_batch}, {hf['requests']} requests (A) | "
              f"{hf['wall_s']:.2f} | {hf['requests'] / hf['wall_s']:.2f} | {hf_rate:.0f} | "
              f"{hf['requests']} | - | 1.0x |")
    speedup = ours["A"]["wall_s"] / ours["B"]["wall_s"]
    print(f"\nQwen2.5-VL image cache: B (repeated images) runs {speedup:.2f}x faster than A; "
          f"target vs HF >= 10x on A: "
          f"{'met' if hf_rate and ours['A']['out_tokens'] / ours['A']['wall_s'] >= 10 * hf_rate else 'not met'}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--distinct", type=int, default=16)
    ap.add_argument("--width", type=int, default=None, help="default 1280 (--tiny: 112)")
    ap.add_argument("--height", type=int, default=None, help="default 720 (--tiny: 84)")
    ap.add_argument("--question", type=int, default=64)
    ap.add_argument("--out", type=int, default=128)
    ap.add_argument("--hf-num", type=int, default=64, help="HF runs the first N requests of A")
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: tiny config, small run")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--profile", action="store_true",
                    help="per-phase times (vlm_profile.py): preprocess alone, pipe, encoder "
                         "device time, and a text-only run at A's prompt lengths")
    args = ap.parse_args()
    if args.tiny:
        args.num, args.distinct, args.out = min(args.num, 8), min(args.distinct, 2), min(args.out, 8)
        args.hf_num, args.hf_batch = 4, 2
    small = args.tiny and args.width is None and args.height is None
    args.width, args.height = args.width or (112 if small else 1280), args.height or (84 if small else 720)
    return args


def make_workloads(args: argparse.Namespace) -> dict:
    """warm-up, A (distinct images), B (``--distinct`` images repeated); with ``--profile``
    fresh images for the preprocess alone and C (A's prompt lengths, no images)."""
    size = (args.width, args.height)
    qs = questions(args.num, args.question, seed=1)
    b_pool = make_images(args.distinct, size, seed=3)
    workloads = {"warm": (make_images(4, size, seed=4), questions(4, args.question, seed=5)),
                 "A": (make_images(args.num, size, seed=2), qs),
                 "B": ([b_pool[i % args.distinct] for i in range(args.num)], qs)}
    if args.profile:
        from sgdsl.runtime.multimodal.pixels import smart_resize

        h, w = smart_resize(args.height, args.width, 28, 3136, 12845056)
        tokens = 3 + args.question + h * w // 784
        workloads["pre"] = (make_images(args.num, size, seed=6), qs)
        workloads["C"] = (None, questions(args.num, tokens, seed=7))
    return workloads


def run_hf_fitting(work: Path, ids: Any, workloads: dict, args: argparse.Namespace,
                   device: str) -> dict | None:
    """HF ``generate`` on A's first ``--hf-num`` requests, halving the batch until it fits."""
    images, qs = workloads["A"]
    hf = None
    while not args.skip_hf and hf is None and args.hf_batch >= 1:
        oom = False
        try:
            hf = run_hf(work, ids, images[:args.hf_num], qs[:args.hf_num], args.out,
                        args.hf_batch, device, args.tiny)
        except torch.OutOfMemoryError:  # report at the largest batch that fits
            oom = True
        if oom:  # outside the handler: its traceback no longer holds the model
            gc.collect()
            torch.cuda.empty_cache()
            print(f"HF out of memory at batch {args.hf_batch}; halving", flush=True)
            args.hf_batch //= 2
    return hf


def main() -> None:
    args = parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-vlm-"))
    work.mkdir(parents=True, exist_ok=True)
    ids = build_dir(work, args.tiny, device)
    workloads = make_workloads(args)
    prof: dict = {}
    if args.profile:  # the scheduler process reads it at start
        os.environ.setdefault("SGDSL_STEP_TRACE", str(work / "trace"))
    ours = run_ours(work, ids, workloads, args.out, args.tiny, prof)
    hf = run_hf_fitting(work, ids, workloads, args, device)
    print(f"HF: {hf}", flush=True)
    report(ours, hf, args)
    if args.profile:
        from transformers import AutoConfig

        vlm_profile.report(prof, ours, AutoConfig.from_pretrained(str(work)).vision_config)
        trace = Path(os.environ["SGDSL_STEP_TRACE"]) / "steps-rank0.jsonl"
        if trace.is_file():
            print(vlm_profile.trace_totals(str(trace)))


if __name__ == "__main__":
    main()

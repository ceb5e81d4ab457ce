"""Where a JSON-constrained decode step waits: the structured-decode benchmark's mask-only and
unconstrained runs at one batch size under the torch profiler (host ops by self time, and the
CUDA runtime calls that block the host: synchronizations, allocations, frees), plus the caching
allocator's retry count (a retry frees cached blocks, which synchronizes the device).

    python benchmarks/gpu/profile_structured_decode.py --batch 32
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import bench_structured_decode as bench
from common import device_line, model_dir, random_prompts

BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
            "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaFreeHost", "cudaMemcpy ",
            "cudaMemcpyAsync", "aten::item", "aten::_local_scalar_dense", "aten::pin_memory")


def profiled(sched, prompts, constrained: bool, max_new: int, top: int) -> None:
    cuda = torch.cuda.is_available()
    stats = (lambda: torch.cuda.memory_stats().get("num_alloc_retries", 0)) if cuda else int
    retries = stats()
    with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as prof:
        res = bench.run_mode(sched, prompts, constrained, max_new)
    retries = stats() - retries
    print(f"\n### {'mask-only' if constrained else 'unconstrained'}: {res['steps']} steps, "
          f"{res['wall']:.2f} s, allocator retries {retries}")
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))
    for e in events:
        if any(e.key.startswith(b) for b in BLOCKING):
            print(f"{e.key:32s} calls {e.count:6d} cpu total {e.cpu_time_total / 1e3:9.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from sgdsl.runtime.grammar import create_grammar_backend

    print(device_line())
    tok = AutoTokenizer.from_pretrained(model_dir(a.model))
    eos = json.loads(Path(model_dir(a.model), "config.json").read_text())["eos_token_id"]
    bench.EOS.extend(eos if isinstance(eos, list) else [eos])
    config, runner = bench.build_runner(a.model, a.batch)
    vocab = int(runner.model_config.vocab_size)
    backend = create_grammar_backend("xgrammar", tok, vocab, bench.EOS)
    prompts = random_prompts(a.batch, 256, seed=a.batch, vocab=min(vocab, 120000))
    for mode in ("mask-only", "unconstrained"):
        sched = bench.make_scheduler(runner, config, tok, backend, mode)
        constrained = mode != "unconstrained"
        bench.run_mode(sched, prompts, constrained, 16)  # warm-up
        sched.memory.flush()
        profiled(sched, prompts, constrained, a.max_new, a.top)
        sched.memory.flush()  # the pool is the runner's: give the next scheduler every slot
        if sched.grammar:
            sched.grammar.shutdown()


if __name__ == "__main__":
    main()

"""The Engine's front-end cost: ``Engine.generate([...])`` vs the same scheduler driven in-process
(issue 29, item 1), at the same config, prompts and output lengths, in one run.

(a) in-process: the scheduler the engine's child process builds (``scheduler/process._build``:
    same grammar manager, decoder and config), fed the requests directly and stepped to the end,
    as the child's loop does; (b) the Engine: one ``generate`` call with every prompt. Per batch
    size: a JSON-schema run (the 5-field person schema of bench_structured_decode.py), an
    unconstrained one (ignore_eos) at the lengths the constrained in-process run produced, so
    both paths and all modes do the same work, and that unconstrained one streamed (each
    request its own ``async_generate(stream=True)`` on one loop, as a server consumes them). Both paths are alive at once and their runs
    interleave (``--repeat`` rounds, medians), so the host's drifting load hits both alike.
    Printed: wall, tokens/s, forward steps, ms per step, Engine vs in-process, and CPU time per
    step: the scheduler's (in-process / the Engine's child) and the Engine's main process's
    (request building, IPC, detokenization, the output check: the front-end's own cost).

CPU (default: a 2-layer Llama at the embedded model's tokenizer, random weights, so the forward
is cheap and the per-step host costs show):

    python benchmarks/bench_engine_frontend.py --batches 1 32 256

GPU (the issue's shapes):

    python benchmarks/bench_engine_frontend.py --model benchmarks/gpu/configs/llama-3.1-8b \\
        --device cuda --batches 1 32 256 --prompt-len 256 --max-new 96

``--py-spy DIR``: record every timed run with py-spy into DIR as speedscope files (the Engine's
with its scheduler process and workers), for where the time goes.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # imported by other scripts too
from proc_stats import cpu_seconds  # noqa: E402
from tiny_llama import tiny_llama_dir  # noqa: E402

SCHEMA = json.loads((Path(__file__).resolve().parent / "person_schema.json").read_text())


def make_config(a: argparse.Namespace):
    from sgdsl.runtime.config import EngineConfig

    bs = max(a.batches)
    return EngineConfig(model=a.model or tiny_llama_dir(), load_format="dummy", device=a.device,
                        context_length=a.prompt_len + a.max_new + 64, max_running_requests=bs,
                        cuda_graph_max_bs=bs, chunked_prefill_size=a.chunk,
                        max_prefill_tokens=max(a.chunk, 8192), num_threads=a.threads,
                        mem_fraction_static=a.mem_fraction,
                        max_total_tokens=bs * (a.prompt_len + a.max_new) + 4096)


def prompts_for(n: int, length: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, 30000) for _ in range(length)] for _ in range(n)]


def params_for(constrained: bool, max_new: int, lengths: list[int] | None, n: int) -> list[dict]:
    if lengths is not None:
        return [{"max_new_tokens": max(1, k), "ignore_eos": True, "temperature": 0.0}
                for k in lengths]
    base = {"max_new_tokens": max_new, "temperature": 0.0}
    if constrained:
        base["json_schema"] = json.dumps(SCHEMA)
    else:
        base["ignore_eos"] = True
    return [base] * n


class InProcess:
    """The engine child's scheduler, in this process; ``run`` = one Engine.generate's work."""

    def __init__(self, config) -> None:
        from sgdsl.runtime.scheduler.process import (SWITCH_INTERVAL_S, _build,
                                                     freeze_startup_objects)

        self.outs: dict[str, list[int]] = {}
        self.done = 0
        self.sched, _ = _build(config, self._collect)
        freeze_startup_objects()  # as the child process does after startup
        sys.setswitchinterval(SWITCH_INTERVAL_S)

    def _collect(self, msg) -> None:
        for o in getattr(msg, "outs", ()):
            self.outs.setdefault(o.rid, []).extend(o.new_ids)
            self.done += o.finish_reason is not None

    def run(self, prompts: list[list[int]], params: list[dict], stream: bool = False) -> dict:
        from sgdsl.runtime.ipc import messages as m
        from sgdsl.runtime.sampling_params import SamplingParams

        self.outs, self.done = {}, 0
        steps0 = self.sched.counters["forward_steps"]
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for i, (ids, p) in enumerate(zip(prompts, params)):
            self.sched.handle(m.TokenizedGenerateReq(f"r{i}", ids, SamplingParams(**p),
                                                     stream=stream))
        while self.done < len(prompts):
            self.sched.step()
        _sync()
        wall = time.perf_counter() - t0
        lengths = [len(self.outs[f"r{i}"]) for i in range(len(prompts))]
        return {"wall": wall, "steps": self.sched.counters["forward_steps"] - steps0,
                "sched_cpu": time.process_time() - cpu0, "lengths": lengths}

    def close(self) -> None:
        self.sched.memory.flush()
        if self.sched.grammar is not None:
            self.sched.grammar.shutdown()


def engine_run(engine, prompts: list[list[int]], params: list[dict],
               stream: bool = False) -> dict:
    """One generate call: wall, steps, and the CPU seconds of this (the main) process and of
    the scheduler process over it (CPU time, unlike wall time, barely moves with the host's
    load: the front-end's cost itself)."""
    child = engine._tm.proc.pid
    steps0 = engine.stats()["forward_steps"]
    cpu0, sched0 = time.process_time(), cpu_seconds(child)
    t0 = time.perf_counter()
    res = (asyncio.run(_streams(engine, prompts, params)) if stream
           else engine.generate(input_ids=prompts, sampling_params=params))
    wall = time.perf_counter() - t0
    cpu, sched = time.process_time() - cpu0, cpu_seconds(child) - sched0
    return {"wall": wall, "steps": engine.stats()["forward_steps"] - steps0, "main_cpu": cpu,
            "sched_cpu": sched, "lengths": [len(r["output_ids"]) for r in res]}


async def _streams(engine, prompts: list[list[int]], params: list[dict]) -> list[dict]:
    """Every prompt as its own stream on one loop, as a server's handlers consume them."""
    async def one(ids: list[int], p: dict) -> dict:
        last = None
        async for last in await engine.async_generate(input_ids=ids, sampling_params=p,
                                                      stream=True):
            pass
        return last
    return await asyncio.gather(*(one(ids, p) for ids, p in zip(prompts, params)))


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(a, name: str, fn, *args, children: bool = False) -> dict:
    """``fn(*args)``, recorded by py-spy (``--py-spy``: this process, and with ``children`` the
    engine's scheduler process and workers) if asked."""
    spy = None
    if a.py_spy:
        os.makedirs(a.py_spy, exist_ok=True)
        out = os.path.join(a.py_spy, f"{name}.speedscope")
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(os.getpid()), "--format",
                                "speedscope", "-o", out, "--rate", "100", "--nonblocking"]
                               + (["--subprocesses"] if children else []),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached before the clock starts
    try:
        return fn(*args)
    finally:
        if spy is not None:
            import signal

            spy.send_signal(signal.SIGINT)
            spy.wait(120)


def run_both(a, config) -> tuple[dict, dict]:
    """Both paths alive at once, their runs interleaved (the host's load drifts): per batch
    size a warm-up of each, then ``--repeat`` rounds of in-process / Engine, JSON then plain
    (at the JSON run's lengths). (batch, mode) -> list of results, per path."""
    from sgdsl.runtime import Engine

    ip = InProcess(config)
    inproc: dict = {}
    eng: dict = {}
    with Engine(config) as engine:
        for bs in a.batches:
            prompts = prompts_for(bs, a.prompt_len, seed=bs)
            json_params = params_for(True, a.max_new, None, bs)
            lengths = ip.run(prompts, json_params)["lengths"]  # warm-up (compile, kernels)
            ip.sched.memory.flush()
            engine_run(engine, prompts, json_params)
            engine.flush_cache()
            plain = params_for(False, a.max_new, lengths, bs)
            for r in range(a.repeat):
                for mode, params in (("json", json_params), ("plain", plain),
                                     ("stream", plain)):
                    tag, stream = f"bs{bs}-{mode}-{r}", mode == "stream"
                    inproc.setdefault((bs, mode), []).append(
                        timed(a, f"inproc-{tag}", ip.run, prompts, params, stream))
                    ip.sched.memory.flush()
                    eng.setdefault((bs, mode), []).append(
                        timed(a, f"engine-{tag}", engine_run, engine, prompts, params, stream,
                              children=True))
                    engine.flush_cache()
        engine.check_idle_integrity()
    ip.close()
    return inproc, eng


def _median(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]


def report(a, inproc: dict, eng: dict) -> None:
    print(f"\n## Engine vs in-process scheduler ({a.model or 'tiny 2-layer Llama'}, {a.device}, "
          f"prompt {a.prompt_len}, max_new {a.max_new}, median of {a.repeat} interleaved rounds)")
    print("| batch | mode | tokens | in-proc s | Engine s | in-proc tok/s | Engine tok/s | "
          "Engine/in-proc | steps in/eng | in-proc ms/step | Engine ms/step | "
          "sched CPU ms/step in-proc/Engine | Engine main-process CPU ms/step |")
    print("|" + "---|" * 13)
    for (bs, mode), runs in inproc.items():
        ip, en = _median(runs), _median(eng[bs, mode])
        tok_i, tok_e = sum(ip["lengths"]), sum(en["lengths"])
        per = lambda r, k: 1e3 * r[k] / max(r["steps"], 1)  # noqa: E731
        main_cpu = sorted(per(r, "main_cpu") for r in eng[bs, mode])[len(eng[bs, mode]) // 2]
        print(f"| {bs} | {mode} | {tok_i}/{tok_e} | {ip['wall']:.3f} | {en['wall']:.3f} | "
              f"{tok_i / ip['wall']:.0f} | {tok_e / en['wall']:.0f} | "
              f"{(tok_e / en['wall']) / (tok_i / ip['wall']):.3f}x | {ip['steps']}/{en['steps']}"
              f" | {per(ip, 'wall'):.2f} | {per(en, 'wall'):.2f} | {per(ip, 'sched_cpu'):.2f}/"
              f"{per(en, 'sched_cpu'):.2f} | {main_cpu:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="config dir (dummy weights); default: tiny")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--chunk", type=int, default=8192, help="chunked_prefill_size")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    ap.add_argument("--mem-fraction", type=float, default=0.3,
                    help="mem_fraction_static (CUDA; the KV pool is max_total_tokens anyway)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (median)")
    ap.add_argument("--py-spy", default=None, metavar="DIR")
    a = ap.parse_args()
    config = make_config(a)
    print(f"config: {config}", flush=True)
    inproc, eng = run_both(a, config)
    for (bs, mode), runs in eng.items():  # same weights, same greedy path: the same outputs
        if any(r["lengths"] != inproc[bs, mode][0]["lengths"] for r in runs):
            print(f"NOTE: batch {bs} {mode}: the Engine's output lengths differ from in-process")
    report(a, inproc, eng)


if __name__ == "__main__":
    sys.exit(main())

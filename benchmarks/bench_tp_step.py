"""The decode step's work outside the graph (tp-step), on the CPU: per-token time of batch-1
greedy decode through the Engine of a tiny random Llama at TP=1 and TP=2 (gloo), with the
step as before (``old``: the batch path, rank 0's ids broadcast) and as now (``new``: the step
graphs' path run eagerly, no broadcast), in the same run. On a CPU there are no graphs and
the forward is small, so this measures the host's side of a step (and gloo's broadcast), not
the GPU's: the GPU rows are ``benchmarks/gpu/bench_tp.py --step new,old``.

    python benchmarks/bench_tp_step.py --tp 1,2 --out-len 128 --repeat 5

Per-token time = (t(out_len tokens) - t(1 token)) / (out_len - 1), the median of ``--repeat``
pairs; the variants' engines run side by side, their pairs interleaved round by round so that
the box's load moves them alike. Per step (``$SGDSL_STEP_TRACE``, rank 0): the median host
time of a decode iteration of the scheduler loop and of its launch (on a CPU the launch holds
the forward and the sampling, which run as they are queued).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import json
import statistics
import tempfile
import time
from pathlib import Path

from tiny_llama import tiny_llama_dir

# as benchmarks/gpu/bench_tp.py STEP_VARIANTS (eager: the CPU has no graphs to capture)
VARIANTS = {"old": {"SGDSL_DECODE_STEP": "off", "SGDSL_TP_IDS": "broadcast"},
            "new": {"SGDSL_DECODE_STEP": "eager", "SGDSL_TP_IDS": "local"}}


@contextlib.contextmanager
def env_set(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def pair_s(engine, ids: list[int], out_len: int) -> float:
    """Seconds per decoded token from a 1-token and an ``out_len``-token greedy request."""
    times = {}
    for n in (1, out_len):
        engine.flush_cache()
        t0 = time.perf_counter()
        out = engine.generate(input_ids=ids, sampling_params={
            "max_new_tokens": n, "ignore_eos": True, "temperature": 0.0})
        times[n] = time.perf_counter() - t0
        assert len(out["output_ids"]) == n
    return (times[out_len] - times[1]) / (out_len - 1)


def decode_iterations(folder: str) -> tuple[float, float]:
    """Median host us of rank 0's decode iterations (one request running, no extend) and of
    their ``_launch_decode``."""
    rows = [json.loads(line) for line in
            (Path(folder) / "steps-rank0.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["running"] == 1 and not r["extend"] and "_launch_decode" in r]
    return (statistics.median(r["ms"] for r in rows) * 1e3,
            statistics.median(r["_launch_decode"] for r in rows) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    from sgdsl.runtime import Engine

    model = tiny_llama_dir()
    ids = [100 + i for i in range(a.prompt_len)]
    for tp in map(int, a.tp.split(",")):
        engines, traces = {}, {}
        for name, env in VARIANTS.items():
            traces[name] = tempfile.mkdtemp(prefix=f"tp-step-{name}-")
            with env_set({**env, "SGDSL_STEP_TRACE": traces[name]}):
                engines[name] = Engine(model, load_format="dummy", tp_size=tp, num_threads=1,
                                       max_running_requests=4, grammar_backend="none")
            pair_s(engines[name], ids, 8)  # warm-up
        times: dict[str, list[float]] = {n: [] for n in engines}
        for _ in range(a.repeat):
            for name, engine in engines.items():
                times[name].append(pair_s(engine, ids, a.out_len))
        steps = {n: engines[n].stats().get("whole_decode_steps", 0) for n in engines}
        for engine in engines.values():
            engine.shutdown()
        med = {n: statistics.median(t) * 1e6 for n, t in times.items()}
        for name in engines:
            it, launch = decode_iterations(traces[name])
            print(f"TP={tp} {name}: {med[name]:.0f} us/token (median of {a.repeat}; runs "
                  f"{', '.join(f'{t * 1e6:.0f}' for t in times[name])}; whole steps "
                  f"{steps[name]}); rank 0 per decode iteration: {it:.0f} us, its launch "
                  f"{launch:.0f} us (medians)", flush=True)
        print(f"TP={tp} new / old per-token time: {med['new'] / med['old']:.3f} "
              f"({med['old'] - med['new']:+.0f} us/token saved)", flush=True)


if __name__ == "__main__":
    main()

"""Tensor parallelism (issue 10): batch-1 decode of Llama-3.1-8B at TP=1 vs TP=2, and
Llama-3.1-70B (does not fit one GPU) at TP=2: batch-1 decode and offline 256 x 1024 in / 256 out.
All dummy bf16 weights (each rank draws its own shard of the same seeded model), through the
Engine (one process per rank, NCCL, CUDA graphs with the all-reduces captured), greedy.

Batch-1 decode tok/s = (out - 1) / (t(out tokens) - t(1 token)): prefill and request overhead
cancel. Floors printed next to the results: decode reads every weight once per token, so
tok/s <= HBM bandwidth / weight bytes per GPU; offline needs 2 * params FLOPs per token.
Targets: 8B TP=2 >= 1.5x TP=1; 70B TP=2 batch-1 >= 45 tok/s.

Needs 2 GPUs (the device tool's nvidia-h200-x2 kind):
  python bench_tp.py --runs 8b-tp1,8b-tp2,70b-tp2,70b-offline
Programmatic dependent launch (runtime/kernels/pdl.py, ``SGDSL_PDL``) A/B in one run:
  python bench_tp.py --runs 8b-tp1,8b-tp4 --pdl both    (or a run named 8b-tp4-pdl)
The TP decode chain's switches (bench_tp_chain.py) A/B through the Engine, a row per variant:
  python bench_tp.py --runs 8b-tp4 --chain base,new
The decode step's work outside the graph (tp-step) A/B through the Engine, a row per variant:
  python bench_tp.py --runs 8b-tp1,8b-tp4 --pdl on --chain all --step new,old
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re

import torch

from common import model_dir, print_table, random_prompts, run_engine, time_decode

HBM_TB_S = 4.3  # per GPU, as issue 10 states the floor (H200 spec sheet: 4.8)
BF16_TFLOPS = 989.0  # dense bf16 per H100/H200 SXM
PARAMS = {"llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9}


def copy_tb_s() -> float:
    """This card's device-to-device copy bandwidth (bytes read + written per second, TB/s): the
    floor a weights-read decode can reach in practice (the spec sheet's figure is higher)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * 10 * x.numel() / (start.elapsed_time(end) * 1e-3) / 1e12


@contextlib.contextmanager
def env_set(values: dict[str, str]):
    """Environment variables for the engines started inside (their rank processes read them)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# tp-step: new = decode steps whole in the step graphs (runtime/model/step_graphs.py) and no
# sampled-ids broadcast (runtime/distributed/sampled_ids.py), main's defaults; old = as before
# (plain decode graphs with the step's work outside them, rank 0's ids broadcast); nobcast =
# old without the broadcast (the broadcast's share); nolocal = new with every greedy step's
# logits all-gathered (the share of the greedy pick from each rank's columns, TP > 1)
STEP_VARIANTS = {"new": {"SGDSL_DECODE_STEP": "graph", "SGDSL_TP_IDS": "local",
                         "SGDSL_LOCAL_GREEDY": "1"},
                 "old": {"SGDSL_DECODE_STEP": "off", "SGDSL_TP_IDS": "broadcast"},
                 "nobcast": {"SGDSL_DECODE_STEP": "off", "SGDSL_TP_IDS": "local"},
                 "nolocal": {"SGDSL_DECODE_STEP": "graph", "SGDSL_TP_IDS": "local",
                             "SGDSL_LOCAL_GREEDY": "0"}}


def pdl_env(on: bool):
    """``SGDSL_PDL`` for the engines started inside."""
    return env_set({"SGDSL_PDL": "1" if on else "0"})


def decode_tok_s(model: str, tp: int, prompt_len: int, out_len: int,
                 custom_ar: bool = True) -> float:
    from sgdsl.runtime import Engine

    ids = random_prompts(1, prompt_len, seed=0)[0]
    params = lambda n: {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}  # noqa: E731
    with Engine(model=model_dir(model), load_format="dummy", tp_size=tp, max_running_requests=4,
                cuda_graph_max_bs=4, context_length=4096, grammar_backend="none",
                disable_custom_all_reduce=not custom_ar) as engine:
        engine.generate(input_ids=ids, sampling_params=params(out_len))  # warm-up
        return 1 / time_decode(engine, ids, out_len)[1]


def decode_row(model: str, tp: int, a: argparse.Namespace, custom_ar: bool = True,
               pdl: bool = False, chain: str = "", step: str = "") -> list:
    from bench_tp_chain import VARIANTS

    timeline = {"SGDSL_STEP_TIMELINE": a.timeline + f"/{model}-tp{tp}-{step or 'default'}"}
    with pdl_env(pdl), env_set(VARIANTS[chain] if chain else {}), \
            env_set(STEP_VARIANTS[step] if step else {}), env_set(timeline if a.timeline else {}):
        tok_s = decode_tok_s(model, tp, a.prompt_len, a.out_len, custom_ar)
    if a.timeline:
        print_timeline(timeline["SGDSL_STEP_TIMELINE"], tok_s)
    floor = HBM_TB_S * 1e12 / (2 * PARAMS[model] / tp)  # bf16: 2 bytes per weight
    measured = a.copy_tb_s * 1e12 / (2 * PARAMS[model] / tp)
    ar = "" if tp == 1 else (" custom all-reduce" if custom_ar else " NCCL only")
    ar += " PDL" if pdl else ""
    ar += f" chain={chain}" if chain else ""
    ar += f" step={step}" if step else ""
    return [f"{model} TP={tp} batch-1 decode{ar}", tok_s, floor, tok_s / floor, measured,
            tok_s / measured]


def print_timeline(prefix: str, tok_s: float) -> None:
    """Rank 0's $SGDSL_STEP_TIMELINE summary (runtime/model/step_timeline.py) beside the
    Engine's per-token time: the graph, between two graphs, and the host's share."""
    import json

    try:
        t = json.load(open(f"{prefix}-rank0.json"))
    except OSError:
        print(f"timeline: none written at {prefix} (fewer decode steps than it keeps?)")
        return
    token = 1e6 / tok_s
    print(f"timeline ({t['steps']} steps, rows {t['rows']}): graph {t['graph_us']:.0f} us, "
          f"between graphs {t['between_us']:.0f} us (p90 {t['between_us_p90']:.0f}), period "
          f"{t['period_us']:.0f} us; Engine {token:.0f} us/token: {token - t['period_us']:+.0f} "
          f"us beyond the device's period", flush=True)


def offline_row(a: argparse.Namespace) -> list:
    model, tp = "llama-3.1-70b", 2
    prompts = random_prompts(a.num, 1024, seed=1)
    r = run_engine(model, prompts, 256, tp_size=tp, max_running_requests=a.num,
                   cuda_graph_max_bs=a.num, chunked_prefill_size=8192,
                   max_prefill_tokens=16384, context_length=4096)
    total = (r["in_tokens"] + r["out_tokens"]) / r["wall_s"]
    compute_floor = tp * BF16_TFLOPS * 1e12 / (2 * PARAMS[model])  # tok/s if compute-bound
    # decode steps each read all weights once: 256 steps at the bandwidth floor, + prefill
    decode_s = 256 * (2 * PARAMS[model] / tp) / (HBM_TB_S * 1e12)
    prefill_s = r["in_tokens"] / compute_floor
    bw_floor = (r["in_tokens"] + r["out_tokens"]) / (decode_s + prefill_s)
    return [f"{model} TP=2 offline {a.num}x1024/256 total", total, min(compute_floor, bw_floor),
            total / min(compute_floor, bw_floor), "-", "-"]


def decode_rows(run: str, a: argparse.Namespace) -> list:
    """The rows of one run name (``8b-tp4``; ``8b-tp4-pdl``: PDL on whatever ``--pdl`` says)."""
    both = {"on": [True], "off": [False], "both": [False, True]}
    name, pdl_run = (run[:-4], True) if run.endswith("-pdl") else (run, False)
    size, tp = name.split("-tp")
    rows = []
    chains = a.chain.split(",") if a.chain else [""]
    steps = a.step.split(",") if a.step else [""]
    for pdl in ([True] if pdl_run else both[a.pdl]):
        for on in (both[a.custom_ar] if int(tp) > 1 else [True]):
            for chain in chains:
                for step in steps:
                    rows.append(decode_row(f"llama-3.1-{size}", int(tp), a, on, pdl, chain,
                                           step))
                    print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="8b-tp1,8b-tp2,70b-tp2,70b-offline")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--custom-ar", choices=["on", "off", "both"], default="on",
                    help="TP runs with the custom all-reduce, NCCL only, or both rows")
    ap.add_argument("--pdl", choices=["on", "off", "both"], default="off",
                    help="decode runs with programmatic dependent launch (SGDSL_PDL=1), "
                         "without, or both rows; a run named like 8b-tp4-pdl is on")
    ap.add_argument("--chain", default="",
                    help="comma-separated variants of the TP decode chain's switches "
                         "(bench_tp_chain.VARIANTS: base, new, ...), a row each")
    ap.add_argument("--timeline", default="",
                    help="a folder: each decode row's device timeline ($SGDSL_STEP_TIMELINE, "
                         "rank 0: the graph's time and the time between graphs) printed")
    ap.add_argument("--step", default="",
                    help="comma-separated variants of the decode step's work outside the "
                         "graph (STEP_VARIANTS: new, old, nobcast, nolocal), a row each")
    a = ap.parse_args()
    assert torch.cuda.device_count() >= 2 or a.runs == "8b-tp1", "needs 2 GPUs"
    a.copy_tb_s = copy_tb_s()
    print(f"device-to-device copy: {a.copy_tb_s:.2f} TB/s (read + write)", flush=True)
    rows = []
    for run in a.runs.split(","):
        if run == "70b-offline":
            rows.append(offline_row(a))
        else:
            rows += decode_rows(run, a)
            continue
        print(rows[-1], flush=True)
    print_table("Tensor parallelism (dummy bf16, CUDA graphs, overlap on)",
                ["run", "tok/s", f"floor @{HBM_TB_S} TB/s", "of floor",
                 f"floor @{a.copy_tb_s:.2f} TB/s copy", "of copy floor"], rows)
    print_pdl_ratios(rows)
    print_tp_ratios(rows)


def print_tp_ratios(rows: list) -> None:
    """Each TP row's tok/s over the TP=1 row of the same model and switches, and us/token."""
    by_name = {r[0]: r[1] for r in rows if isinstance(r[1], float)}
    for name, tok_s in by_name.items():
        one = by_name.get(re.sub(r"TP=\d+ (.*?) custom all-reduce", r"TP=1 \1", name))
        print(f"{name}: {1e6 / tok_s:.0f} us/token"
              + (f", {tok_s / one:.3f}x TP=1" if one and "TP=1 " not in name else ""))


def print_pdl_ratios(rows: list) -> None:
    """tok/s with PDL over the same run's tok/s without it, where both ran."""
    by_name = {r[0]: r[1] for r in rows}
    for name, tok_s in by_name.items():
        base = by_name.get(name.removesuffix(" PDL")) if name.endswith(" PDL") else None
        if base:
            print(f"PDL on / off: {tok_s / base:.3f}x  ({name.removesuffix(' PDL')}: "
                  f"{base:.1f} -> {tok_s:.1f} tok/s, {1e6 / base - 1e6 / tok_s:+.1f} us/token saved)")


if __name__ == "__main__":
    main()

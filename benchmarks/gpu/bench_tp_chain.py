"""The TP batch-1 decode chain's switches A/B on one loaded model: each TP rank builds the model
runner once (dummy weights), then for every variant (a set of environment switches) recaptures
the decode CUDA graph and times it replayed back to back (the GPU's time per token, no
scheduler), in rounds that alternate the variants (drift and clocks hit every variant alike).

The switches (tp-chain; defaults in brackets):
- ``SGDSL_LAMPORT_SPIN`` [all]: the barrier-free all-reduce waits on every peer's slot at once
  (``serial``: one peer after another, a dependent round trip each).
- ``SGDSL_LAMPORT_VEC`` [1]: its pushes and spins as 16-byte vectors (0: 2-byte elements).
- ``SGDSL_GEMV_EPILOGUE_TP`` [1]: rotary + KV store and SiLU-and-mul as the qkv / gate_up
  products' epilogues on each rank's shard (0: separate kernels under TP, as first built).
- ``SGDSL_GEMV_PRE`` / ``SGDSL_GEMV_PAIRS_PRE`` [4 / 2]: weight blocks each matrix-vector
  program loads before PDL's wait (gemv.py / gemv_pairs.py).
- ``SGDSL_PDL_TRIGGER`` [early]: each kernel lets the next launch before its own wait (``wait``).
- ``SGDSL_ATTN_PRE`` [1]: decode attention reads the page table and the earlier tokens' K/V
  before its wait.

    python bench_tp_chain.py --tp 4 --model llama-3.1-8b           # ~1 min on 4x H200
    python bench_tp_chain.py --tp 4 --model llama-3.1-70b --variants base,new,new-pre8
    python bench_tp_chain.py --tiny --tp 2 --steps 2      # a dry run on the CPU (gloo)
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

from common import device_line, model_dir, print_table

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

BASE = {"SGDSL_LAMPORT_SPIN": "serial", "SGDSL_LAMPORT_VEC": "0", "SGDSL_GEMV_EPILOGUE_TP": "0",
        "SGDSL_GEMV_PRE": "1", "SGDSL_GEMV_PAIRS_PRE": "1", "SGDSL_PDL_TRIGGER": "wait",
        "SGDSL_ATTN_PRE": "0"}
AR = {**BASE, "SGDSL_LAMPORT_SPIN": "all", "SGDSL_LAMPORT_VEC": "1"}
EPI = {**AR, "SGDSL_GEMV_EPILOGUE_TP": "1"}


def _on(gemv: int = 1, pairs: int = 1, early: bool = False, attn: bool = False
        ) -> dict[str, str]:
    """Main's defaults (``EPI``) with the off-by-default switches set."""
    return {**EPI, "SGDSL_GEMV_PRE": str(gemv), "SGDSL_GEMV_PAIRS_PRE": str(pairs),
            "SGDSL_PDL_TRIGGER": "early" if early else "wait",
            "SGDSL_ATTN_PRE": "1" if attn else "0"}


VARIANTS = {
    "base": BASE,  # the chain as before tp-chain
    "ar": AR,  # + the all-reduce's one spin and vectors
    "ar+epi": EPI,  # + the epilogues on each rank's shard
    "early": _on(early=True),  # + the next grid launched before each wait
    "attn": _on(attn=True),  # + attention's K/V of earlier tokens read before the wait
    "new": _on(4, 2),  # + weight blocks before the wait: 4 (gemv) / 2 (pairs)
    "pre4x1": _on(4, 1),
    "new-pre2": _on(2, 2),
    "new-pre4": _on(4, 4),
    "new-pre8": _on(8, 4),
    "new-pre8x8": _on(8, 8),
    "new-early": _on(4, 2, early=True),
    "new-attn": _on(4, 2, attn=True),
    "new-pre4-early": _on(4, 4, early=True),
    "all": _on(4, 2, early=True, attn=True),  # main's defaults now
    "all-pre8x8": _on(8, 8, early=True, attn=True),
    "pre4-only": {**BASE, "SGDSL_GEMV_PRE": "4", "SGDSL_GEMV_PAIRS_PRE": "2"},
}


def _recapture(runner) -> None:
    """The decode graphs again, under the current environment (the switches are read while
    the kernels are launched, i.e. at capture)."""
    runner.cuda_graph_runner = None
    gc.collect()
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
        torch.cuda.empty_cache()
    runner.cuda_graph_runner = runner._init_cuda_graphs()


def _step_us(runner, batch, steps: int) -> float:
    """Microseconds per replay of the batch-1 decode graph, ``steps`` replays back to back
    (every rank replays as many: their all-reduces meet). On a CPU (``--tiny``, a dry run of
    this script): eager forwards, wall time."""
    from sgdsl.runtime.distributed.collectives import barrier

    graphs = runner.cuda_graph_runner
    if graphs is None:
        barrier(timeout_s=120)
        t0 = time.perf_counter()
        for _ in range(steps):
            runner.forward(batch)
        return (time.perf_counter() - t0) * 1e6 / steps
    graph = graphs.graphs[graphs.load(batch)]
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize(runner.device)
    barrier(timeout_s=120)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / steps


def _logits(runner, batch) -> torch.Tensor:
    """The step's logits from one replay (the same inputs every time: the same bits expected
    from every variant, as the switches keep every sum's order)."""
    graphs = runner.cuda_graph_runner
    if graphs is None:
        return runner.forward(batch).float().cpu()
    padded = graphs.load(batch)
    graphs.graphs[padded].replay()
    out = graphs.outputs[padded]
    return (out[0] if isinstance(out, tuple) else out).float().cpu()


def _weight_bytes(runner) -> int:
    """Bytes a decode step reads from this rank's weights (the embedding: one row, left out)."""
    return sum(p.numel() * p.element_size() for name, p in runner.model.named_parameters()
               if "embed_tokens" not in name)


def rank_main(rank: int, tp: int, port: int, a: argparse.Namespace, out: dict) -> None:
    from bench_tp import copy_tb_s
    from probe_tp_step import _kernel_table, _last_batch
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.distributed.state import init_tp_group
    from sgdsl.runtime.model.runner import ModelRunner
    from tests.runtime.model.driver import RunnerDriver

    device = torch.device("cpu" if a.tiny else f"cuda:{rank}")
    if not a.tiny:
        torch.cuda.set_device(rank)
    if rank == 0:
        out["copy_tb_s"] = 1.0 if a.tiny else copy_tb_s()
    init_tp_group(rank, tp, device, f"tcp://127.0.0.1:{port}")
    runner = ModelRunner(EngineConfig(
        model=a.tiny or model_dir(a.model), load_format="dummy", tp_size=tp,
        device=device.type, max_running_requests=1, cuda_graph_max_bs=1,
        context_length=256 if a.tiny else 4096, max_total_tokens=4096,
        grammar_backend="none"))
    driver = RunnerDriver(runner)
    req = driver.new_request()
    token = int(driver.extend([(req, list(range(1, a.prompt_len + 1)))]).argmax(-1)[0])
    batch = _last_batch(runner, driver, req, token)
    names = a.variants.split(",")
    times: dict[str, list[float]] = {n: [] for n in names}
    diffs: dict[str, float] = {}
    ref = None
    for r in range(a.rounds):
        for name in names:
            os.environ.update(VARIANTS[name])
            _recapture(runner)
            logits = _logits(runner, batch)
            ref = logits if ref is None else ref
            diffs[name] = max(diffs.get(name, 0.0), float((logits - ref).abs().max()))
            times[name].append(_step_us(runner, batch, a.steps))
            if rank == 0:
                print(f"round {r} {name}: {times[name][-1]:.1f} us/step, logits max |diff| vs "
                      f"{names[0]} {diffs[name]:.3g}", flush=True)
            if a.kernels and r == a.rounds - 1:
                _kernel_table(runner, batch, f"{a.model} TP={tp} {name}", show=rank == 0)
    if rank == 0:
        out["times"], out["diffs"] = times, diffs
        out["weight_bytes"] = _weight_bytes(runner)


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--variants", default="base,ar,ar+epi,early,attn,new-pre4,all",
                    help=f"comma-separated, of {sorted(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200, help="replays timed per variant a round")
    ap.add_argument("--prompt-len", type=int, default=128,
                    help="tokens in the KV cache (--tiny: 16)")
    ap.add_argument("--kernels", action="store_true", help="a per-kernel table per variant")
    ap.add_argument("--json", default="", help="write the medians and the fastest here")
    ap.add_argument("--tiny", action="store_true",
                    help="a dry run on the CPU: a tiny random Llama, gloo, eager forwards")
    a = ap.parse_args()
    if a.tiny:
        import tempfile

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "tests", "runtime", "model"))
        from tiny import tiny_model

        a.tiny, a.prompt_len = tempfile.mkdtemp(prefix="tp-chain-tiny-"), 16
        tiny_model("llama", a.tiny, vocab_size=256, tie_word_embeddings=False)
    for name in a.variants.split(","):
        assert name in VARIANTS, f"unknown variant {name!r} (known: {sorted(VARIANTS)})"
    t0 = time.time()
    out = mp.Manager().dict()
    mp.spawn(rank_main, args=(a.tp, _port(), a, out), nprocs=a.tp)
    times, bw, diffs = out["times"], out["copy_tb_s"], out["diffs"]
    floor_us = out["weight_bytes"] / (bw * 1e12) * 1e6
    base = statistics.median(next(iter(times.values())))
    rows = []
    for name, ts in times.items():
        us = statistics.median(ts)
        switches = " ".join(f"{k.removeprefix('SGDSL_')}={v}" for k, v in VARIANTS[name].items())
        rows.append([name, us, min(ts), 1e6 / us, floor_us / us, base - us, diffs[name],
                     switches])
    print(device_line(), f"| copy {bw:.2f} TB/s | {time.time() - t0:.0f} s")
    model = "tiny llama (CPU dry run)" if a.tiny else a.model
    print_table(f"{model} TP={a.tp} batch-1 decode step, the runner's graph alone "
                f"(weights floor {floor_us:.0f} us per GPU at the copy bandwidth; median of "
                f"{a.rounds} rounds x {a.steps} replays)",
                ["variant", "us/step", "min", "tok/s (GPU only)", "of floor",
                 f"us saved vs {next(iter(times))}", "logits max |diff|", "switches"], rows)
    if a.json:
        # only a variant with the reference's bits can win (the switches keep every sum's order)
        same = [n for n in times if diffs[n] == 0.0]
        best = min(same, key=lambda n: statistics.median(times[n]))
        with open(a.json, "w") as f:
            json.dump({"median_us": {n: statistics.median(t) for n, t in times.items()},
                       "max_diff": diffs, "best": best, "floor_us": floor_us}, f, indent=1)
        print(f"fastest: {best} ({a.json})")


if __name__ == "__main__":
    main()

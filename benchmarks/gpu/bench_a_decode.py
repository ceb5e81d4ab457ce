"""Workload A: batch-1 decode, Llama-3.1-8B (dummy bf16 weights), 128 prompt tokens, 256 output
tokens, greedy, every step's token read back to the host (as a server must).

Runs the model runner directly (no scheduler process) in three modes: triton + CUDA graphs
(ours), triton eager, torch_native eager. Target: >= 165 tok/s on one H100.
"""
from __future__ import annotations

import argparse
import gc

import torch

from common import Timer, model_dir, print_table
from driver import Driver
from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.runner import ModelRunner


def run(backend: str, graphs: bool, prompt_len: int, out_len: int, model: str) -> list:
    runner = ModelRunner(EngineConfig(model=model_dir(model), load_format="dummy",
                                      attention_backend=backend, disable_cuda_graph=not graphs,
                                      max_total_tokens=4 * (prompt_len + out_len),
                                      max_running_requests=4, cuda_graph_max_bs=4,
                                      context_length=4096))
    d = Driver(runner)
    gen = torch.Generator().manual_seed(0)
    # warm-up request (Triton compiles, cuBLAS heuristics), then the measured one
    for measured in (False, True):
        seq = d.new_seq(torch.randint(0, 1000, (prompt_len,), generator=gen).tolist())
        with Timer() as t_pre:
            d.extend([seq])
        with Timer() as t_dec:
            for _ in range(out_len - 1):
                d.decode([seq])
        d.release([seq])
    tok_s = (out_len - 1) / t_dec.s
    name = f"{backend}{' + cuda graphs' if graphs else ''}"
    del runner, d
    gc.collect()
    torch.cuda.empty_cache()
    return [name, t_pre.s * 1e3, t_dec.s / (out_len - 1) * 1e3, tok_s]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--modes", default="triton+graphs,triton,torch_native")
    a = ap.parse_args()
    rows = []
    for mode in a.modes.split(","):
        backend, graphs = mode.replace("+graphs", ""), mode.endswith("+graphs")
        rows.append(run(backend, graphs, a.prompt_len, a.out_len, a.model))
        print(rows[-1], flush=True)
    print_table(f"A: batch-1 decode, {a.model}, {a.prompt_len} in / {a.out_len} out",
                ["mode", "prefill ms", "ms/token", "decode tok/s"], rows)


if __name__ == "__main__":
    main()

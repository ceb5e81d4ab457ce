"""Workload A: batch-1 decode (default Llama-3.1-8B; ``--model`` any carried config, e.g.
qwen3-30b-a3b, mixtral-8x7b; ``--quantization fp8``), dummy weights, 128 prompt tokens, 256 output
tokens, greedy, every step's token read back to the host (as a server must).

Runs the model runner directly (no scheduler process) in three modes: triton + CUDA graphs
(ours), triton eager, torch_native eager; and, with ``engine`` in ``--modes``, end to end
through the Engine (scheduler process, IPC, detokenizer) with overlap scheduling on
(``engine``) or off (``engine-sync``): decode tok/s = (out - 1) / (t(out tokens) - t(1 token)),
so prefill and request overhead cancel. Target: >= 165 tok/s on one H100.
"""
from __future__ import annotations

import argparse
import gc

import torch

from common import Timer, model_dir, print_table, time_decode
from driver import Driver
from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.runner import ModelRunner


def run(backend: str, graphs: bool, prompt_len: int, out_len: int, model: str,
        **engine_kw) -> list:
    runner = ModelRunner(EngineConfig(model=model_dir(model), load_format="dummy",
                                      attention_backend=backend, disable_cuda_graph=not graphs,
                                      max_total_tokens=4 * (prompt_len + out_len),
                                      max_running_requests=4, cuda_graph_max_bs=4,
                                      context_length=4096, **engine_kw))
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


def run_engine_mode(overlap: bool, prompt_len: int, out_len: int, model: str,
                    repeat: int = 1, **engine_kw) -> list[list]:
    """One Engine, ``repeat`` measurements (one row each: the spread without a reload)."""
    from sgdsl.runtime import Engine

    prompt = torch.randint(0, 1000, (prompt_len,), generator=torch.Generator().manual_seed(0))
    ids = prompt.tolist()
    params = lambda n: {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}  # noqa: E731
    name = f"engine, overlap {'on' if overlap else 'off'}"
    rows = []
    with Engine(model=model_dir(model), load_format="dummy", max_running_requests=4,
                cuda_graph_max_bs=4, context_length=4096, grammar_backend="none",
                disable_overlap_schedule=not overlap, **engine_kw) as engine:
        engine.generate(input_ids=ids, sampling_params=params(out_len))  # warm-up
        for _ in range(repeat):
            first, dec = time_decode(engine, ids, out_len)
            rows.append([name, first * 1e3, dec * 1e3, 1 / dec])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--modes", default="triton+graphs,triton,torch_native")
    ap.add_argument("--quantization", default=None, help="fp8: quantize the weights at load")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--mem-fraction-static", type=float, default=0.85)
    ap.add_argument("--repeat", type=int, default=1, help="engine modes: measurements per Engine")
    a = ap.parse_args()
    kw = dict(quantization=a.quantization, kv_cache_dtype=a.kv_cache_dtype)
    rows = []
    for mode in a.modes.split(","):
        if mode.startswith("engine"):
            rows += run_engine_mode(mode == "engine", a.prompt_len, a.out_len, a.model,
                                    a.repeat, mem_fraction_static=a.mem_fraction_static, **kw)
            print(*rows[-a.repeat:], sep="\n", flush=True)
            continue
        backend, graphs = mode.replace("+graphs", ""), mode.endswith("+graphs")
        rows.append(run(backend, graphs, a.prompt_len, a.out_len, a.model, **kw))
        print(rows[-1], flush=True)
    quant = f", weights {a.quantization or 'bf16'}, KV {a.kv_cache_dtype}"
    print_table(f"A: batch-1 decode, {a.model}{quant}, {a.prompt_len} in / {a.out_len} out",
                ["mode", "prefill ms (engine: 1-token request)", "ms/token", "decode tok/s"], rows)


if __name__ == "__main__":
    main()

"""Issue 25, row (a): batch-1 decode of Llama-3.1-8B (dummy weights) with STANDALONE speculation
whose draft model is the target itself (the same config and seed: the same dummy weights, so
every draft is accepted: the mechanism's ceiling), against the same Engine without
speculation, and the weights-read floor. One Engine per mode, in the same run.

Decode tok/s = (out - 1) / (t(out tokens) - t(1 token)) (``common.time_decode``: prefill and
request overhead cancel). Tokens per verify step = completion tokens / ``spec_verify_ct``.

NOTE: a draft as large as the target costs one target-sized forward per draft token, so this
row cannot beat ~(k + 1) / (k + 1 + verify overhead) of the plain decode whatever the
acceptance; ``--draft`` names a smaller carried config (e.g. qwen2.5-0.5b shapes are another
vocabulary: use a Llama-vocabulary config) to time a cheap draft (its dummy weights disagree
with the target's, so acceptance is then ~0: only the draft's cost is measured).

    cd benchmarks/gpu && python bench_speculative_standalone.py [--draft-tokens 2,4] [--out-len 256]
    (CPU smoke: --model <a tiny config dir> --context-length 512 --out-len 24)
"""
from __future__ import annotations

import argparse
import gc
import os

import torch

from common import model_dir, print_table, time_decode

HBM_TB_S = {"H200": 4.3, "H100": 3.35}  # H200: issue 10's floor; H100: the SXM spec sheet
PARAMS = {"llama-3.1-8b": 8.03e9}


def config_dir(name: str) -> str:
    """A carried config's name, or any config directory (e.g. a tiny one for a CPU smoke)."""
    return name if os.path.isdir(name) else model_dir(name)


def floor_tok_s(model: str) -> float:
    if not torch.cuda.is_available():
        return float("nan")
    name = torch.cuda.get_device_name()
    tb_s = next((v for k, v in HBM_TB_S.items() if k in name), 3.35)
    return tb_s * 1e12 / (2 * PARAMS.get(model, 8.03e9))  # bf16: 2 bytes per weight


def engine_row(model: str, draft: str | None, k: int, prompt: list[int], out_len: int,
               context: int) -> list:
    from sgdsl.runtime import Engine

    kw = dict(model=config_dir(model), load_format="dummy", max_running_requests=8,
              cuda_graph_max_bs=8, max_total_tokens=16384, context_length=context,
              grammar_backend="none")
    if draft is not None:  # NOTE: verify rows (k + 1) fit the captured graphs (<= 8)
        kw.update(speculative_algorithm="STANDALONE", speculative_draft_model_path=config_dir(draft),
                  speculative_num_draft_tokens=k, speculative_num_steps=k)
    with Engine(**kw) as engine:
        engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 32,
                                                            "ignore_eos": True, "temperature": 0})
        first, per_token = time_decode(engine, prompt, out_len)
        out = engine.generate(input_ids=prompt, sampling_params={
            "max_new_tokens": out_len, "ignore_eos": True, "temperature": 0})
        steps = out["meta_info"].get("spec_verify_ct") or out["meta_info"]["completion_tokens"]
        stats = engine.stats()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    name = "no speculation" if draft is None else f"STANDALONE draft {draft}, {k} draft tokens"
    return [name, per_token * 1e3, 1 / per_token, out_len / steps,
            stats.get("spec_accept_rate", float("nan"))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--draft", default=None, help="draft config (default: the target's)")
    ap.add_argument("--draft-tokens", default="4")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--context-length", type=int, default=4096)
    a = ap.parse_args()
    prompt = torch.randint(10, 1000, (a.prompt_len,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    rows = [engine_row(a.model, None, 0, prompt, a.out_len, a.context_length)]
    print(rows[-1], flush=True)
    for k in map(int, a.draft_tokens.split(",")):
        rows.append(engine_row(a.model, a.draft or a.model, k, prompt, a.out_len,
                               a.context_length))
        print(rows[-1], flush=True)
    base, floor = rows[0][2], floor_tok_s(a.model)
    table = [r + [r[2] / base, r[2] / floor] for r in rows]
    print_table(f"issue 25 (a): batch-1 decode, {a.model}, STANDALONE, {a.prompt_len} in / "
                f"{a.out_len} out (floor {floor:.0f} tok/s)",
                ["mode", "ms/token", "tok/s", "tokens/verify step", "accept rate",
                 "x no speculation", "x floor"], table)


if __name__ == "__main__":
    main()

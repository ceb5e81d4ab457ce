"""EAGLE / EAGLE3 / STANDALONE step cost on one GPU (issue 25): Llama-3.1-8B config, dummy bf16
weights for the target and for a head written at the published shapes (EAGLE3: Llama-3.1-8B's,
a 32000-token draft vocabulary; STANDALONE: the target's own weights drafting), batch 1,
greedy, against the plain engine in the same run; each speculative configuration with its
CUDA graphs (draft steps and tree verify) and without (``speculative_disable_cuda_graph``:
those forwards eager, the target's decode graphs kept).

Dummy heads are (almost) never accepted, so this times what a step costs: the head's draft
levels plus a verify of ``num_draft_tokens`` tree nodes (chains at topk 1 run the decode
graphs; trees the tree-verify graphs). A trained head's speedup is then ~ tokens per verify
step x (plain ms/token / EAGLE ms per step). STANDALONE self-drafting accepts every draft:
its step is ``num_draft_tokens`` draft decodes plus one verify.

    cd benchmarks/gpu && python bench_speculative_eagle.py [--algos EAGLE3,EAGLE,STANDALONE]
        [--topk 1,4] [--modes graphs,eager]
    (CPU smoke: --model <a tiny config dir> --context-length 512 --out-len 16 --modes eager)
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from common import model_dir, print_table, random_prompts


def config_dir(name: str) -> str:
    return name if os.path.isdir(name) else model_dir(name)


def write_head_config(target: str, eagle3: bool, folder: Path) -> str:
    """A head directory (config.json only: load_format dummy) at the target's shapes."""
    cfg = json.loads((Path(target) / "config.json").read_text())
    cfg.update(num_hidden_layers=1)
    if eagle3:
        cfg.update(architectures=["LlamaForCausalLMEagle3"], tie_word_embeddings=False,
                   draft_vocab_size=min(32000, cfg["vocab_size"]))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def batch1(a: argparse.Namespace, spec: dict) -> list:
    """(ms per output token, tokens per verify step) of one greedy request."""
    from sgdsl.runtime import Engine

    ids = random_prompts(1, a.prompt_len, seed=0)[0]
    greedy = lambda n: {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0}  # noqa: E731
    with Engine(model=config_dir(a.model), load_format="dummy", max_running_requests=8,
                context_length=a.context_length, grammar_backend="none", **spec) as engine:
        engine.generate(input_ids=ids, sampling_params=greedy(a.out_len))  # warm-up
        times = {}
        for n in (1, a.out_len):
            engine.flush_cache()
            t0 = time.perf_counter()
            out = engine.generate(input_ids=ids, sampling_params=greedy(n))
            times[n] = time.perf_counter() - t0
    per_token = (times[a.out_len] - times[1]) / (a.out_len - 1)
    steps = out["meta_info"].get("spec_verify_ct") or a.out_len
    return [per_token * 1e3, a.out_len / steps]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--algos", default="EAGLE3,EAGLE,STANDALONE")
    ap.add_argument("--topk", default="1,4")
    ap.add_argument("--modes", default="graphs,eager", help="speculative CUDA graphs on/off")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--context-length", type=int, default=4096)
    a = ap.parse_args()
    plain = batch1(a, {})
    rows = [["plain", plain[0], 1e3 / plain[0], 1.0, plain[0], 1.0]]
    print(rows[-1], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in configs(a, Path(tmp)):
            eager_ms = None
            for mode in a.modes.split(","):
                ms, per_step = batch1(a, dict(spec, speculative_disable_cuda_graph=mode == "eager"))
                step_ms = ms * per_step
                if mode == "eager":
                    eager_ms = step_ms
                rows.append([f"{name}, {mode}", ms, 1e3 / ms, per_step, step_ms,
                             step_ms / plain[0]])
                print(rows[-1], flush=True)
            if eager_ms is not None and len(a.modes.split(",")) > 1:
                graphs_ms = rows[-2][4] if a.modes.startswith("graphs") else rows[-1][4]
                print(f"{name}: graphs step / eager step = {graphs_ms / eager_ms:.3f}",
                      flush=True)
    print_table(f"Speculative step cost, {a.model} dummy, batch 1, {a.prompt_len} in / "
                f"{a.out_len} out, {a.draft_tokens} draft tokens",
                ["mode", "ms/token", "tok/s", "tokens/step", "ms per verify step",
                 "step / plain token"], rows)


def configs(a: argparse.Namespace, tmp: Path) -> list[tuple[str, dict]]:
    """(name, engine options) of every speculative configuration asked for."""
    out = []
    for algo in a.algos.split(","):
        if algo == "STANDALONE":  # the target's own dummy weights draft a chain
            out.append((f"STANDALONE self-draft, {a.draft_tokens} tokens", dict(
                speculative_algorithm=algo, speculative_draft_model_path=config_dir(a.model),
                speculative_num_draft_tokens=a.draft_tokens)))
            continue
        head = write_head_config(config_dir(a.model), algo == "EAGLE3", tmp / algo)
        for topk in map(int, a.topk.split(",")):
            out.append((f"{algo} topk {topk}, {a.steps} steps, dummy head", dict(
                speculative_algorithm=algo, speculative_draft_model_path=head,
                speculative_num_steps=a.steps, speculative_eagle_topk=topk,
                speculative_num_draft_tokens=max(a.draft_tokens, topk))))
    return out


if __name__ == "__main__":
    main()

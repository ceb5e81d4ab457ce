"""Speculative decoding on one GPU (issue 25): Llama-3.1-8B config, dummy bf16 weights, greedy,
every row against the non-speculative engine in the same run.

Rows (one Engine per side, run one after the other so each has the GPU to itself):
  (a) STANDALONE, the target's own dummy weights as the draft (acceptance ~100%: the mechanism's
      ceiling), batch 1, ``--draft-tokens`` per step;
  (b) NGRAM on a copy-heavy batch-1 prompt whose continuation repeats it: R + O + R, where O is
      the plain engine's greedy output after R (measured in the same run), so the model's output
      repeats text of its prompt;
  (c) batch 64 (random prompts), NGRAM on vs off (speculation backs off above
      ``speculative_max_batch_size``: the target is >= 0.97x);
  (d) JSON-schema-constrained batch 1 (xgrammar, jump-forward on), NGRAM vs off.
Batch-1 decode tok/s = (out - 1) / (t(out tokens) - t(1 token)), so prefill and request overhead
cancel; tokens per verify step = completion_tokens / spec_verify_ct (meta_info). The weights-read
floor is the copy bandwidth measured on this card over the weight bytes (and the spec sheet's).

    python benchmarks/gpu/bench_speculative.py            # all rows
    python benchmarks/gpu/bench_speculative.py --rows a,b --draft-tokens 4
    python benchmarks/gpu/bench_speculative.py --rows a --min-speedup 0  # (a) ungated
"""
from __future__ import annotations

import argparse
import importlib.util
import time

from bench_tp import PARAMS, copy_tb_s
from common import model_dir, print_table, random_prompts

MODEL = "llama-3.1-8b"
SHEET_TB_S = {"H100": 3.35, "H200": 4.8}
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
    "city": {"type": "string", "maxLength": 20},
    "occupation": {"enum": ["engineer", "teacher", "doctor", "artist", "farmer", "other"]},
    "is_employed": {"type": "boolean"}},
    "required": ["name", "age", "city", "occupation", "is_employed"], "additionalProperties": False}


def greedy(n: int, **extra) -> dict:
    return {"max_new_tokens": n, "ignore_eos": True, "temperature": 0.0, **extra}


def open_engine(side: str, a: argparse.Namespace, grammar: bool):
    from sgdsl.runtime import Engine

    kw = dict(model=model_dir(MODEL), load_format="dummy", max_running_requests=a.batch,
              context_length=4096, grammar_backend="xgrammar" if grammar else "none")
    if side != "plain" and a.min_speedup is not None:
        kw["speculative_min_speedup"] = a.min_speedup
    if side == "ngram":
        kw.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=a.draft_tokens)
    elif side == "standalone":
        kw.update(speculative_algorithm="STANDALONE", speculative_draft_model_path=model_dir(MODEL),
                  speculative_num_draft_tokens=a.draft_tokens)
    return Engine(**kw)


def batch1(engine, ids: list[int], out_len: int, **extra) -> tuple[float, float | None]:
    """(decode tok/s, tokens per verify step or None) of one greedy request."""
    times, meta = {}, {}
    engine.generate(input_ids=ids, sampling_params=greedy(out_len, **extra))  # warm-up
    for n in (1, out_len):
        engine.flush_cache()
        t0 = time.perf_counter()
        out = engine.generate(input_ids=ids, sampling_params=greedy(n, **extra))
        times[n], meta = time.perf_counter() - t0, out["meta_info"]
    tok_s = (out_len - 1) / (times[out_len] - times[1])
    return tok_s, _per_step(meta)


def _per_step(meta: dict) -> float | None:
    ct = meta.get("spec_verify_ct")
    return meta["completion_tokens"] / ct if ct else None


def batched(engine, prompts: list[list[int]], out_len: int) -> float:
    """Output tokens per second of a batch submitted at once (one warm-up batch first)."""
    engine.generate(input_ids=prompts[:8], sampling_params=greedy(out_len))
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=greedy(out_len))
    return sum(len(o["output_ids"]) for o in outs) / (time.perf_counter() - t0)


def json_batch1(engine, ids: list[int], out_len: int) -> tuple[float, float | None, int]:
    """JSON-constrained: (output tok/s including prefill, tokens per step, tokens)."""
    params = {"max_new_tokens": out_len, "temperature": 0.0, "json_schema": SCHEMA}
    engine.generate(input_ids=ids, sampling_params=params)  # warm-up (compile)
    engine.flush_cache()
    t0 = time.perf_counter()
    out = engine.generate(input_ids=ids, sampling_params=params)
    wall = time.perf_counter() - t0
    n = out["meta_info"]["completion_tokens"]
    return n / wall, _per_step(out["meta_info"]), n


def run_side(side: str, a: argparse.Namespace, work: dict) -> dict:
    """Every requested row's measurement on one engine (``side``: plain, ngram, standalone)."""
    rows = {"plain": set(a.rows.split(",")), "standalone": {"a"},
            "ngram": set(a.rows.split(",")) - {"a"}}[side]
    grammar = "d" in rows and importlib.util.find_spec("xgrammar") is not None
    res: dict = {}
    with open_engine(side, a, grammar) as engine:
        if "a" in rows:
            res["a"] = batch1(engine, work["prompt"], a.out_len)
        if "b" in rows:
            if "copy" not in work:  # the plain side computes O, the continuation repeated
                o = engine.generate(input_ids=work["prompt"], sampling_params=greedy(a.out_len))
                work["copy"] = work["prompt"] + o["output_ids"] + work["prompt"]
            res["b"] = batch1(engine, work["copy"], a.out_len)
        if "c" in rows:
            res["c"] = batched(engine, work["batch"], a.batch_out_len)
        if "d" in rows:
            res["d"] = json_batch1(engine, work["prompt"], a.json_out_len) if grammar else None
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="a,b,c,d")
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-out-len", type=int, default=128)
    ap.add_argument("--json-out-len", type=int, default=128)
    ap.add_argument("--min-speedup", type=float, default=None,
                    help="speculative_min_speedup of the speculative engines (default: the "
                         "engine's, 1.0: the cost gate on, which probes row (a)'s self-draft "
                         "only after 1024 plain steps; 0: off, the mechanism's ceiling)")
    a = ap.parse_args()
    work = {"prompt": random_prompts(1, a.prompt_len, seed=0)[0],
            "batch": random_prompts(a.batch, a.prompt_len, seed=1)}
    import torch

    name = torch.cuda.get_device_name()
    weight_bytes = 2 * PARAMS[MODEL]
    floor = copy_tb_s() * 1e12 / weight_bytes
    sheet = next((v for k, v in SHEET_TB_S.items() if k in name), None)
    plain = run_side("plain", a, work)
    spec = run_side("ngram", a, work) if set(a.rows.split(",")) - {"a"} else {}
    if "a" in a.rows.split(","):
        spec["a"] = run_side("standalone", a, work)["a"]
    table = []
    labels = {"a": "(a) STANDALONE self-draft, batch 1", "b": "(b) NGRAM copy-heavy, batch 1",
              "c": f"(c) NGRAM batch {a.batch}", "d": "(d) NGRAM JSON schema, batch 1"}
    for row in [r for r in "abcd" if r in plain]:
        base, got = plain[row], spec.get(row)
        if base is None or got is None:
            table.append([labels[row], "skipped (no xgrammar)", "", "", "", ""])
            continue
        b, g = (base, got) if isinstance(base, float) else (base[0], got[0])
        per_step = None if isinstance(got, float) else got[1]
        table.append([labels[row], b, g, g / b, per_step if per_step else "-",
                      g / floor if row != "c" else "-"])
    print_table(f"speculative decoding, {MODEL} dummy bf16, {a.draft_tokens} draft tokens "
                f"(floor {floor:.0f} tok/s from measured copy bandwidth"
                + (f", {sheet * 1e12 / weight_bytes:.0f} from the spec sheet" if sheet else "")
                + ")", ["row", "plain tok/s", "spec tok/s", "ratio", "tokens/verify",
                        "spec / floor"], table)


if __name__ == "__main__":
    main()

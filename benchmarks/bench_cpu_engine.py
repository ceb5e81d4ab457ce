"""CPU benchmark: our Engine vs Hugging Face transformers ``generate`` on the embedded SmolLM2,
in one process and one run (ours first, then HF, never at the same time).

(a) batch-1 decode tokens/s: (N) / (time of a 1+N-token generation - time of a 1-token one),
    so prefill cost cancels out; greedy, EOS ignored.
(b) few-shot: G groups x Q questions; each prompt = a P-token prefix shared in its group + a
    T-token question; 1-token answer. Per-request time = wall time of the whole workload / (G*Q).
    Ours submits the workload as one batch (the radix cache shares the prefixes); HF runs
    ``generate`` per request.

    python benchmarks/bench_cpu_engine.py [--threads 2] [--decode-tokens 128]

``--model DIR --dummy`` runs both on random weights at DIR's config (speed does not depend on
the weights), for machines where the embedded model's files cannot be installed; DIR needs
config.json (e.g. benchmarks/smollm2_135m_config.json) and tokenizer files.
"""
from __future__ import annotations

import argparse
import random
import time


def workload(vocab_lo: int, vocab_hi: int, groups: int, questions: int, prefix_len: int,
             question_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(groups):
        prefix = [rng.randrange(vocab_lo, vocab_hi) for _ in range(prefix_len)]
        for _ in range(questions):
            prompts.append(prefix + [rng.randrange(vocab_lo, vocab_hi) for _ in range(question_len)])
    return prompts


def bench_ours(args, decode_prompt: list[int], fewshot: list[list[int]]) -> tuple[float, float]:
    from sgdsl.runtime import Engine

    extra = {"load_format": "dummy"} if args.dummy else {}
    with Engine(args.model, device="cpu", num_threads=args.threads, grammar_backend="none",
                **extra) as engine:
        greedy = {"temperature": 0, "ignore_eos": True}
        engine.generate(input_ids=decode_prompt, sampling_params={**greedy, "max_new_tokens": 4})
        t1 = _timed(lambda: engine.generate(input_ids=decode_prompt,
                                            sampling_params={**greedy, "max_new_tokens": 1}))
        tn = _timed(lambda: engine.generate(
            input_ids=decode_prompt, sampling_params={**greedy, "max_new_tokens": 1 + args.decode_tokens}))
        engine.flush_cache()
        t_few = _timed(lambda: engine.generate(input_ids=fewshot,
                                               sampling_params={**greedy, "max_new_tokens": 1}))
        stats = engine.stats()
        print(f"  ours: cache hit rate in few-shot {stats['cache_hit_rate']:.2f}")
    return args.decode_tokens / (tn - t1), t_few / len(fewshot)


def bench_hf(args, decode_prompt: list[int], fewshot: list[list[int]]) -> tuple[float, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from sgdsl.runtime.model.embedded import embedded_model_path

    torch.set_num_threads(args.threads)
    model_dir = args.model or str(embedded_model_path())
    if args.dummy:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def gen(ids: list[int], n: int) -> None:
        x = torch.tensor([ids])
        with torch.inference_mode():
            model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=n, min_new_tokens=n, pad_token_id=2)

    gen(decode_prompt, 4)
    t1 = _timed(lambda: gen(decode_prompt, 1))
    tn = _timed(lambda: gen(decode_prompt, 1 + args.decode_tokens))
    t_few = _timed(lambda: [gen(p, 1) for p in fewshot])
    return args.decode_tokens / (tn - t1), t_few / len(fewshot)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--model", default=None, help="model directory (default: embedded SmolLM2)")
    ap.add_argument("--dummy", action="store_true", help="random weights at the model's config")
    args = ap.parse_args()
    decode_prompt = workload(1000, 40000, 1, 1, 16, 0, seed=1)[0]
    fewshot = workload(1000, 40000, args.groups, args.questions, args.prefix_len,
                       args.question_len)
    print(f"threads={args.threads}; decode {args.decode_tokens} tokens; few-shot {args.groups}x"
          f"{args.questions}, prefix {args.prefix_len}, question {args.question_len}, 1-token answer")
    ours_tps, ours_req = bench_ours(args, decode_prompt, fewshot)
    hf_tps, hf_req = bench_hf(args, decode_prompt, fewshot)
    print(f"(a) batch-1 decode: ours {ours_tps:.1f} tok/s, HF {hf_tps:.1f} tok/s, "
          f"ratio {ours_tps / hf_tps:.2f}x")
    print(f"(b) few-shot per request: ours {ours_req * 1000:.1f} ms, HF {hf_req * 1000:.1f} ms, "
          f"speedup {hf_req / ours_req:.2f}x")


if __name__ == "__main__":
    main()

"""The chat route's own per-request work on the server's event loop, stage by stage: the body's
validation (pydantic), the chat template's render, the prompt's encode, the sampling check.
What ``/v1/chat/completions`` pays per request beyond native ``/generate`` (which takes ids).

In-process and single-threaded, so it reads the same on a loaded box (best of ``--rounds``).
Tokenizer and template: Llama-3.1's (``benchmarks/gpu/configs/llama-3.1-8b``, as the GPU
path benchmark serves), prompts as that benchmark makes them (random ids, decoded).

    python benchmarks/bench_chat_frontend.py --prompt-len 256
"""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any, Callable

from transformers import AutoTokenizer

from sgdsl.runtime.server.chat import ChatTemplate
from sgdsl.runtime.server.openai_protocol import ChatCompletionRequest
from sgdsl.runtime.server.tools import render_prompt
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.tokenizer.encoder import ids_encoder

CONFIG = Path(__file__).resolve().parent / "gpu" / "configs" / "llama-3.1-8b"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}}, "required": ["name"]}


def per_call_us(fn: Callable[[Any], Any], items: list[Any], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        for item in items:
            fn(item)
        best = min(best, time.thread_time() - t0)
    return 1e6 * best / len(items)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(str(CONFIG))
    template = ChatTemplate((CONFIG / "chat_template.jinja").read_text(), tok.bos_token,
                            tok.eos_token)
    rng = random.Random(0)
    texts = [tok.decode([rng.randrange(10, 32000) for _ in range(a.prompt_len)])
             for _ in range(a.requests)]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    bodies = [{"model": "default", "messages": [{"role": "user", "content": t}],
               "max_tokens": 96, "temperature": 0.0, "response_format": rf} for t in texts]
    reqs = [ChatCompletionRequest.model_validate(b) for b in bodies]
    prompts = [render_prompt(template, [m.as_template_message() for m in r.messages], None)
               for r in reqs]
    fast = ids_encoder(tok)
    assert all(fast(p) == tok.encode(p, add_special_tokens=False) for p in prompts)

    def check(r: ChatCompletionRequest) -> None:
        raw = {k: v for k, v in r.sampling(96).items() if v is not None}
        SamplingParams.from_dict(raw).validate(tok.vocab_size)
    stages = [
        ("validate body (pydantic)", lambda b: ChatCompletionRequest.model_validate(b), bodies),
        ("render template", lambda r: render_prompt(
            template, [m.as_template_message() for m in r.messages], None), reqs),
        ("encode: tokenizer.encode (before)",
         lambda p: tok.encode(p, add_special_tokens=False), prompts),
        ("encode: ids_encoder (now)", fast, prompts),
        ("sampling dict + check", check, reqs),
    ]
    n_tok = sum(len(fast(p)) for p in prompts) / len(prompts)
    print(f"{a.requests} chat requests, {n_tok:.0f} prompt tokens each, best of {a.rounds}:")
    for name, fn, items in stages:
        print(f"  {name:36s} {per_call_us(fn, items, a.rounds):8.1f} us/request")


if __name__ == "__main__":
    main()

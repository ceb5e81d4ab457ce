"""Quickstart: the bundled runtime's Engine on the embedded SmolLM2-135M-Instruct (CPU is fine).

    python examples/quickstart_engine.py
"""
from __future__ import annotations

import asyncio

from sgdsl.runtime import Engine


def main() -> None:
    with Engine() as engine:  # model=None: the embedded model; the scheduler runs in a child process
        chat = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Name three primary colors."}],
            tokenize=False, add_generation_prompt=True)
        greedy = {"temperature": 0, "max_new_tokens": 32}

        # One prompt -> one dict.
        out = engine.generate(chat, greedy)
        print("answer:", out["text"].strip())
        print("finish:", out["meta_info"]["finish_reason"])

        # A batch of prompts -> a list of dicts (one continuous batch in the scheduler).
        for o in engine.generate(["The capital of France is", "1, 2, 3,"],
                                 {"temperature": 0, "max_new_tokens": 8}):
            print("batch:", repr(o["text"]), "cached tokens:", o["meta_info"]["cached_tokens"])

        # Streaming (the chat prompt is now a radix-cache hit), with a stop string never shown.
        print("stream:", end=" ")
        for chunk in engine.generate(chat, {**greedy, "stop": ["\n"]}, stream=True):
            print(chunk["delta"], end="", flush=True)
        print()

        # Prompt logprobs without generating (what `select` uses to score choices).
        scored = engine.generate("The sky is blue", {"max_new_tokens": 0},
                                 return_logprob=True, logprob_start_len=1)
        total = sum(lp for lp, _, _ in scored["meta_info"]["input_token_logprobs"])
        print(f"logprob of 'The sky is blue' after its first token: {total:.2f}")

        # From asyncio.
        async def ask() -> str:
            res = await engine.async_generate("Hello, my name is", {"temperature": 0,
                                                                    "max_new_tokens": 8})
            return res["text"]

        print("async:", repr(asyncio.run(ask())))
        print("stats:", {k: v for k, v in engine.stats().items() if k.startswith(("cache", "kv"))})


if __name__ == "__main__":
    main()

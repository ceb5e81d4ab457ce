"""Multi-turn chat with streaming: the assistant's replies print token by token.

    python examples/chat.py
"""
from __future__ import annotations

import sgdsl as sgl


@sgl.function
def chat(s, turns: list[str]):
    s += sgl.system("You are a friendly assistant. Keep answers to one sentence.")
    for i, question in enumerate(turns):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"reply_{i}", max_tokens=16, stop="\n"))


def main() -> None:
    turns = ["Hi! What's a good name for a cat?", "Why is that a good name?"]
    state = chat.run(turns=turns, stream=True, temperature=0.0)
    for i, question in enumerate(turns):
        print(f"user: {question}\nassistant: ", end="", flush=True)
        for piece in state.text_iter(f"reply_{i}"):
            print(piece, end="", flush=True)
        print()


if __name__ == "__main__":
    main()

"""Quickstart: a two-turn chat program on the default backend (the embedded SmolLM2 model
running in-process; no configuration needed).

    python examples/quickstart.py
"""
from __future__ import annotations

import sgdsl as sgl


@sgl.function
def multi_turn_question(s, question_1: str, question_2: str):
    s += sgl.system("You are a helpful assistant. Answer in one short sentence.")
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=24, stop="\n"))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=24, stop="\n"))


def main() -> None:
    state = multi_turn_question.run(
        question_1="What is the capital of France?",
        question_2="And what is the capital of Germany?",
        temperature=0.0,
    )
    for message in state.messages():
        print(f"{message['role']:>9}: {message['content']}")
    print("tokens:", state.get_meta_info("answer_2").get("completion_tokens"))


if __name__ == "__main__":
    main()

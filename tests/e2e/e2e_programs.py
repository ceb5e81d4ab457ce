"""The program suite run on every backend: one small program per primitive. Kept short
(few tokens, greedy) so the whole matrix stays cheap on CPU."""
from __future__ import annotations

import sgdsl as sgl

CITIES = ["Paris", "London", "Tokyo"]


@sgl.function
def few_shot_qa(s, question: str):
    s += "Answer each question with one word.\n"
    s += "Q: What color is the sky?\nA: Blue\n"
    s += "Q: What is two plus two?\nA: Four\n"
    s += "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=6, stop="\n", temperature=0.0)


@sgl.function
def multi_turn(s, q1: str, q2: str):
    s += sgl.system("You are a helpful assistant. Answer briefly.")
    s += sgl.user(q1)
    s += sgl.assistant(sgl.gen("a1", max_tokens=12, temperature=0.0))
    s += sgl.user(q2)
    s += sgl.assistant(sgl.gen("a2", max_tokens=12, temperature=0.0))


@sgl.function
def capital_select(s):
    s += sgl.user("What is the capital of France? Answer with the city name.")
    s += sgl.assistant(sgl.select("city", choices=CITIES))


@sgl.function
def fork_tips(s, topic: str):
    s += f"Two short tips about {topic}.\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=6, stop="\n", temperature=0.0)
    forks.join()
    s += "Summary: " + forks[0]["tip"] + " /" + forks[1]["tip"]


@sgl.function
def short_reply(s, at_least: int):
    s += sgl.user("Reply with just the word OK.")
    s += sgl.assistant(sgl.gen("reply", min_tokens=at_least, max_tokens=at_least + 4,
                               temperature=0.0))


@sgl.function
def bad_top_p(s):
    s += sgl.user("Hi")
    s += sgl.assistant(sgl.gen("reply", max_tokens=4, top_p=0.0))


@sgl.function
def legs(s):
    s += sgl.user("How many legs does a dog have? Answer with a number.")
    s += sgl.assistant(sgl.gen_int("n", max_tokens=4, temperature=0.0))


@sgl.function
def phone(s):
    s += sgl.user("Make up a phone number in the format 555-0123.")
    s += sgl.assistant(sgl.gen("phone", regex=r"555-[0-9]{4}", max_tokens=10, temperature=0.0))


PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                  "age": {"type": "integer"}},
                 "required": ["name", "age"], "additionalProperties": False}


@sgl.function
def person(s):
    s += sgl.user("Invent a person. Reply in JSON with name and age.")
    s += sgl.assistant(sgl.gen("person", json_schema=PERSON_SCHEMA, max_tokens=32,
                               temperature=0.0))

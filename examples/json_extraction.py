"""Structured extraction: a JSON schema from a pydantic model constrains decoding (a token
mask on the runtime; native structured output on OpenAI/Anthropic), so the output always
parses.

    python examples/json_extraction.py
"""
from __future__ import annotations

import json

from pydantic import BaseModel

import sgdsl as sgl


class City(BaseModel):
    name: str
    country: str
    population_millions: int


@sgl.function
def extract(s, text: str):
    s += sgl.user(f"Extract the city facts from this text as JSON.\nText: {text}")
    s += sgl.assistant(sgl.gen("city", max_tokens=48, json_schema=City, temperature=0.0))


def main() -> None:
    state = extract.run(text="Paris, the capital of France, has about 2 million inhabitants.")
    data = json.loads(state["city"])
    print(json.dumps(data, indent=2))
    print(City.model_validate(data))


if __name__ == "__main__":
    main()

"""Choosing among options with ``select``: on the runtime each option is scored by the
model's logprobs (the prompt is prefilled once and shared), so the answer is always one of
the choices.

    python examples/select_choices.py
"""
from __future__ import annotations

import sgdsl as sgl


@sgl.function
def classify(s, review: str):
    s += sgl.user(f"Is this review positive or negative?\nReview: {review}")
    s += sgl.assistant("The review is " + sgl.select("label", choices=["positive", "negative"]))


@sgl.function
def capital(s, country: str):
    s += sgl.user(f"What is the capital of {country}?")
    s += sgl.assistant(sgl.select("city", choices=["Paris", "Berlin", "Madrid", "Rome"],
                                  choices_method=sgl.token_length_normalized))


def main() -> None:
    for review in ["I loved it, wonderful food!", "Terrible service, cold food."]:
        print(f"{review!r} -> {classify.run(review=review)['label']}")
    for country in ["France", "Germany"]:
        print(f"capital of {country} -> {capital.run(country=country)['city']}")


if __name__ == "__main__":
    main()

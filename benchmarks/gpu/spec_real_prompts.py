"""Prompts of ``bench_speculative_real.py``: copy-heavy chat requests for the embedded
SmolLM2-135M-Instruct (code editing, "repeat this text"), whose answers repeat long stretches of
the prompt, so NGRAM's drafts (n-grams of the request's own prompt and output) are accepted; and
the person schema of the JSON row. Plain text: the engine tokenizes with the model's tokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path

CODE = '''import json
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def load_items(path):
    with open(path) as f:
        rows = json.load(f)
    return [Item(r["name"], r["price"], r["quantity"]) for r in rows]


def total_price(items):
    total = 0.0
    for item in items:
        total += item.price * item.quantity
    return total


def cheapest(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best


def main():
    items = load_items("items.json")
    print("total:", total_price(items))
    print("cheapest:", cheapest(items).name)


if __name__ == "__main__":
    main()
'''

PROSE = ("The library opens at nine in the morning and closes at six in the evening. Visitors "
         "may borrow up to five books at a time, for three weeks each. Books can be renewed "
         "twice, online or at the front desk, unless another reader has reserved them. Late "
         "returns cost twenty cents a day per book. The reading room on the second floor is "
         "quiet at all times; group study rooms on the third floor can be booked for two hours "
         "a day. Laptops, cameras and headphones are lent for one week. Children under twelve "
         "must be accompanied by an adult after five in the evening. The cafe on the ground "
         "floor serves coffee, tea and sandwiches until four in the afternoon.")

CONFIG = json.dumps({"server": {"host": "0.0.0.0", "port": 8080, "workers": 4, "timeout_s": 30},
                     "database": {"url": "postgres://db.internal:5432/shop", "pool_size": 10,
                                  "retries": 3},
                     "cache": {"backend": "redis", "url": "redis://cache.internal:6379/0",
                               "ttl_s": 600},
                     "logging": {"level": "info", "format": "json", "file": "/var/log/shop.log"},
                     "features": {"checkout_v2": True, "recommendations": False,
                                  "gift_cards": True}}, indent=2)


def chat(text: str) -> str:
    """SmolLM2-Instruct's chat format (ChatML), as its template writes one user turn."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


ROWS = "\n".join(f"{i},item{i},{(i * 37) % 100}.{i % 10}0,{(i * 7) % 13}" for i in range(1, 41))

# NOTE: the 135M model copies best when the prompt starts the copy (completion style): on CPU
# (NGRAM, 4 draft tokens, 128 tokens) the config and CSV copies took 4.7 and 4.9 tokens per
# verify step, the code edit 3.4 (it copies the start, then loops), the chat "repeat" 2.3 (it
# paraphrases). Chat-style edit requests ("rename ... and return the whole file") were not
# followed at all (1.0: it explains the code instead).
COPY_PROMPTS = [
    f"config.json:\n{CONFIG}\n\nThe same config.json, with the port changed to 9090:\n",
    f"items.csv:\nid,name,price,quantity\n{ROWS}\n\nThe same items.csv, copied:\n",
    f"items.py:\n```python\n{CODE}```\n\nitems.py, with total_price renamed to compute_total:"
    "\n```python\n",
    chat(f"Repeat this text exactly, word for word:\n\n{PROSE}"),
]

PERSON_SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "person_schema.json")
                           .read_text())
JSON_PROMPTS = [
    chat("Describe Alice Smith, a 34 year old teacher from Lyon who is employed, as JSON."),
    chat("Give me a JSON object for Bob Jones, 51, a farmer in Kansas, not employed."),
]

"""Greedy references shared by the runtime's acceptance tests: the batch of mixed-length prompts
(``MIXED_PROMPTS``) and Hugging Face transformers' greedy continuations (``hf_greedy``).

Importable from any test as ``from greedy import hf_greedy``: pytest puts ``tests/`` on
``sys.path`` for the suite's root ``conftest.py``.
"""
from __future__ import annotations

from pathlib import Path

# short and long, a chat turn and code: some prompts chunk under a 16-token prefill budget,
# some do not
MIXED_PROMPTS = [
    "Hi",
    "The capital of France is",
    "Write a haiku about the sea and the wind over the rocks at dawn.",
    "<|im_start|>user\nWhat is 12 times 7? Answer with a number.<|im_end|>\n<|im_start|>assistant\n",
    "List three colors of the rainbow, separated by commas, and then explain which of them "
    "is your favourite and why, in one short sentence that a child could understand.",
    "def fibonacci(n):\n    ",
]


def hf_greedy(model_dir: str | Path, prompts: list[str], max_new: int,
              eos_token_id: int | None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy continuation) per prompt from ``generate`` in float32, one prompt at
    a time (no padding); ``eos_token_id`` None: always ``max_new`` tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    refs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([tok.encode(p, add_special_tokens=False)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new, eos_token_id=eos_token_id,
                                 pad_token_id=2)
            refs.append((ids[0].tolist(), out[0, ids.shape[1]:].tolist()))
    return refs

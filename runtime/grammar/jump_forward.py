"""Jump-forward decoding: when the grammar forces a run of text, append it without sampling.

The forced string is re-tokenized together with the last sampled token, so the output stays a
tokenization the tokenizer itself would produce at that boundary (``'{"'`` + ``'name": "'``
becomes ``'{"name'``, ``'":'``, ``' "'`` rather than four one-character tokens). Only the last
token is ever replaced: it was sampled this step, so it has no KV yet and nothing is freed; the
forced tokens get their KV in the next extend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .base import Grammar, allocate_bitmask


@dataclass(frozen=True)
class JumpForward:
    """Already applied to the grammar: drop ``rollback`` trailing output tokens (0 or 1), then
    append ``token_ids``."""

    rollback: int
    token_ids: tuple[int, ...]
    text: str


def jump_forward(grammar: Grammar, tokenizer: Any, output_ids: Sequence[int],
                 budget: int) -> JumpForward | None:
    """Find the forced text, retokenize it at the boundary and advance ``grammar`` over it.

    ``budget`` is how many more output tokens the request may hold; the forced tokens are cut
    to it. Returns None (grammar untouched) when nothing is forced or nothing fits.
    """
    forced = grammar.jump_forward_string()
    if not forced or grammar.is_terminated() or budget <= 0:
        return None
    return force_text(grammar, tokenizer, output_ids, forced, budget)


def force_text(grammar: Grammar, tokenizer: Any, output_ids: Sequence[int], text: str,
               budget: int) -> JumpForward | None:
    """Append ``text`` (which the grammar must accept) as tokens: retokenized together with
    the last output token where that token is a whole character, cut to ``budget`` new tokens.
    Returns None (grammar untouched) when the grammar rejects it or nothing fits."""
    if budget <= 0:
        return None
    if output_ids and grammar.num_accepted > 0:
        last = int(output_ids[-1])
        last_text = tokenizer.decode([last])
        if "\ufffd" not in last_text:  # a whole character: safe to merge with the text
            ids = _encode(tokenizer, last_text + text, budget + 1)
            grammar.rollback(1)
            if ids and grammar.accept_tokens(ids):
                if ids[0] != last:
                    return JumpForward(1, ids, text)
                return JumpForward(0, ids[1:], text) if len(ids) > 1 else None
            grammar.accept_token(last)  # restore the state we rolled back
    ids = _encode(tokenizer, text, budget)
    if ids and grammar.accept_tokens(ids):
        return JumpForward(0, ids, text)
    return None


def _encode(tokenizer: Any, text: str, limit: int) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))[:limit]


def only_stop_allowed(grammar: Grammar, vocab_size: int, stop_ids: Sequence[int]) -> bool:
    """True when nothing but a stop token may follow, so the request can finish without
    spending a decode step on sampling the stop token. Cheap: only a completed match fills a
    row, and the check clears the stop tokens' bits and looks for any bit left (no unpacking
    of the vocabulary)."""
    if grammar.is_terminated():
        return True
    if not grammar.is_completed():
        return False
    row = allocate_bitmask(1, vocab_size)
    grammar.fill_bitmask(row, 0)
    return stop_only_row(row[0], vocab_size, stop_ids)


def stop_only_row(words: torch.Tensor, vocab_size: int, stop_ids: Sequence[int]) -> bool:
    """True when the filled bitmask row ``words`` allows nothing but stop tokens (a copy is
    checked: ``words`` is left as it was). numpy, not torch: see ``allocate_bitmask``."""
    rest = words.numpy().view(np.uint32).copy()
    for t in stop_ids:
        if 0 <= t < vocab_size:
            rest[t // 32] &= np.uint32(~(1 << (t % 32)) & 0xFFFFFFFF)
    # NOTE: bits past vocab_size in the last word are padding, never allowed tokens.
    tail = vocab_size % 32
    if tail:
        rest[-1] &= np.uint32((1 << tail) - 1)
    return not rest.any()

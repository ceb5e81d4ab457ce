"""Jump-forward decoding: when the grammar forces a run of text, append it without sampling.

The forced string is re-tokenized together with the last sampled token, so the output stays a
tokenization the tokenizer itself would produce at that boundary (``'{"'`` + ``'name": "'``
becomes ``'{"name'``, ``'":'``, ``' "'`` rather than four one-character tokens). Only the last
token is ever replaced: it was sampled this step, so it has no KV yet and nothing is freed; the
forced tokens get their KV in the next extend.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import torch

from ..base import Grammar, accept_tokens_grouped, allocate_bitmask
from ..guards.token_rows import clear_tokens
from ..vocab import fast_decoder, fast_encoder


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
    return jump_forward_batch([grammar], tokenizer, [output_ids], [budget])[0]


def jump_forward_batch(grammars: Sequence[Grammar], tokenizer: Any,
                       outputs: Sequence[Sequence[int]], budgets: Sequence[int],
                       known: Sequence[str | None] | None = None) -> list[JumpForward | None]:
    """``jump_forward`` for many requests, their forced tokens accepted in batch calls
    (``force_texts``). ``known[i]``: grammar i's jump-forward text where the caller has it
    (grammar/prefetch.py reads it on its helper thread), None to ask the grammar."""
    known = known or [None] * len(grammars)
    rows = [i for i, (g, budget) in enumerate(zip(grammars, budgets))
            if budget > 0 and not g.is_terminated()]
    texts = {i: known[i] if known[i] is not None else grammars[i].jump_forward_string()
             for i in rows}
    rows = [i for i in rows if texts[i]]
    plans: list[JumpForward | None] = [None] * len(grammars)
    found = force_texts([grammars[i] for i in rows], tokenizer, [outputs[i] for i in rows],
                        [texts[i] for i in rows], [budgets[i] for i in rows])
    for i, plan in zip(rows, found):
        plans[i] = plan
    return plans


def force_text(grammar: Grammar, tokenizer: Any, output_ids: Sequence[int], text: str,
               budget: int) -> JumpForward | None:
    """Append ``text`` (which the grammar must accept) as tokens: retokenized together with
    the last output token where that token is a whole character, cut to ``budget`` new tokens.
    Returns None (grammar untouched) when the grammar rejects it or nothing fits."""
    return force_texts([grammar], tokenizer, [output_ids], [text], [budget])[0]


def force_texts(grammars: Sequence[Grammar], tokenizer: Any, outputs: Sequence[Sequence[int]],
                texts: Sequence[str], budgets: Sequence[int]) -> list[JumpForward | None]:
    """``force_text`` for many requests, the tokens accepted in batch calls (one per token
    position: native and threaded for xgrammar) instead of one call per token.

    NOTE: at 256 decoding rows ~30-70 requests jump per step; accepting their tokens one call
    at a time cost ~8 ms of host time per step on the H100 host. Where the retokenized text
    still begins with the sampled token (62% of the jumps of the GPU benchmark's schema), that
    token stays accepted: no rollback and re-accept (one native call per row less, and one
    token less per row in the batch accepts)."""
    encode, decode = _codec(tokenizer)
    todo = []  # (row, last token merged or None, ids to accept, last token kept)
    for i, (grammar, out, text, budget) in enumerate(zip(grammars, outputs, texts, budgets)):
        if budget <= 0:
            continue
        last = int(out[-1]) if out and grammar.num_accepted > 0 else None
        last_text = decode(last) if last is not None else ""
        if last is None or "\ufffd" in last_text:  # merge only with a whole character
            todo.append((i, None, encode(text)[:budget], False))
            continue
        ids = encode(last_text + text)[:budget + 1]
        if ids[0] == last:  # the sampled token stands: only what follows is new
            if len(ids) > 1:
                todo.append((i, last, ids[1:], True))
            continue
        grammar.rollback(1)
        todo.append((i, last, ids, False))
    oks = accept_tokens_grouped([grammars[i] for i, *_ in todo], [ids for _, _, ids, _ in todo])
    plans: list[JumpForward | None] = [None] * len(grammars)
    for (i, last, ids, kept), ok in zip(todo, oks):
        if not ok and last is not None:  # restore, then the text on its own
            if not kept:
                grammars[i].accept_token(last)
            plans[i] = force_text(grammars[i], tokenizer, (), texts[i], budgets[i])
        elif ok and (last is None or kept):
            plans[i] = JumpForward(0, ids, texts[i])
        elif ok and ids[0] != last:
            plans[i] = JumpForward(1, ids, texts[i])
        elif ok and len(ids) > 1:
            plans[i] = JumpForward(0, ids[1:], texts[i])
    return plans


# NOTE: lockstep requests jump over the same text from the same sampled token (452 distinct
# strings in 1,536 jumps at 256 rows): one encode and one decode each, per tokenizer
_CODECS: dict[int, tuple[Any, Any, Any]] = {}  # id(tokenizer) -> (tokenizer, encode, decode)


def _codec(tokenizer: Any) -> tuple[Any, Any]:
    """Memoized ``encode(text) -> tuple of ids`` and ``decode(token id) -> text`` of
    ``tokenizer`` (deterministic, so a cached answer is the answer)."""
    hit = _CODECS.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        encode, decode = fast_encoder(tokenizer), fast_decoder(tokenizer)
        hit = (tokenizer, lru_cache(8192)(lambda text: tuple(encode(text))),
               lru_cache(8192)(lambda token: decode([token])))
        if len(_CODECS) >= 8:  # tokenizers of finished engines (tests): oldest out
            _CODECS.pop(next(iter(_CODECS)), None)
        _CODECS[id(tokenizer)] = hit
    return hit[1], hit[2]


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
    clear_tokens(rest, (t for t in stop_ids if 0 <= t < vocab_size))
    # NOTE: bits past vocab_size in the last word are padding, never allowed tokens.
    tail = vocab_size % 32
    if tail:
        rest[-1] &= np.uint32((1 << tail) - 1)
    return not rest.any()

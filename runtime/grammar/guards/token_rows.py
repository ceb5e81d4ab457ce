"""A filled bitmask row as the runtime's guards read and change it: numpy ``uint32`` words, bit
``t & 31`` of word ``t >> 5`` set when token ``t`` is allowed (``base.allocate_bitmask``).

The guards (unique keys and items, string lengths: ``unique_keys.py``) clear from a row what the
inner grammar cannot forbid itself, all by one rule: a row they would leave empty stays as it
was (``clear_unless_dead_end``).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np


def has_token(words: np.ndarray, token: int) -> bool:
    return bool((words[token >> 5] >> np.uint32(token & 31)) & 1)


def among(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The tokens of ``ids`` (an int64 array) the row allows, in one numpy gather."""
    return ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)]


def set_ids(words: np.ndarray) -> np.ndarray:
    """Every token the row allows (only the words with a bit set are unpacked)."""
    nz = np.flatnonzero(words)
    bits = np.unpackbits(words[nz].view(np.uint8), bitorder="little").reshape(len(nz), 32)
    return (nz[:, None] * 32 + np.arange(32))[bits.astype(bool)]


def clear_tokens(words: np.ndarray, ids: Iterable[int]) -> None:
    for t in ids:
        words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)


def clear_unless_dead_end(words: np.ndarray, ids: list[int]) -> bool:
    """Clear ``ids`` from the row; True if that left no token (then the row stays as it was:
    see ``undo_if_empty``)."""
    if not ids:
        return False
    before = words.copy()
    clear_tokens(words, ids)
    return undo_if_empty(words, before)


def undo_if_empty(words: np.ndarray, before: np.ndarray) -> bool:
    """True if the row has no token left, then put back as ``before``.

    NOTE: a dead end: the grammar admits nothing but what a guard forbids (a key pattern with
    one spelling, an enum of names all used, a string only a too-long text can end). Sampling
    from an empty row would abort the request; the forbidden token at least parses, and the
    output check in tokenizer/req_state.py still fails the request if the output is invalid."""
    if words.any():
        return False
    words[:] = before
    return True

"""Valid UTF-8 across tokens: which tokens may follow an output's bytes so far without making
them invalid UTF-8, for grammars whose backend does not check it (xgrammar).

xgrammar 0.2.8 lets through byte sequences no UTF-8 decoder accepts when a character is
spelled over several byte-level tokens: surrogates (``ED A0 80``) always, and overlong or
out-of-range sequences (``E0 99 82``, ``F4 90 80 80``) through some multi-byte tokens. A
random-weights Llama-3.1-8B picked such tokens inside a string of ``maxLength: 20``: the
grammar counted one character per sequence, the decoded text had a U+FFFD per byte (23
characters; the output check failed the request). Outlines-core builds its automaton over
valid encodings only (``regex-automata``), so it needs nothing here.

An output's bytes so far leave a UTF-8 decoder in one of ``STATES`` states (at a character
boundary, or inside a character still owing continuation bytes of a given range). Per state
this module tables the state each token leads to (``REJECT``: invalid) and a packed bitmask
row of the tokens that keep the bytes valid (special tokens: allowed at a boundary only).
A request keeps its state per accepted token; a row is ANDed with its state's row.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

BOUNDARY, REJECT, STATES = 0, 8, 9
# states 1-3: 1-3 continuation bytes (0x80-0xBF) still owed; 4-7: the next one has a narrower
# range (after E0: A0-BF, no overlong; ED: 80-9F, no surrogate; F0: 90-BF; F4: 80-8F, at most
# U+10FFFF), then 1 (4, 5) or 2 (6, 7) more
_NARROW = {4: (0xA0, 0xBF, 1), 5: (0x80, 0x9F, 1), 6: (0x90, 0xBF, 2), 7: (0x80, 0x8F, 2)}
_PAD = 256  # the byte column of a padded position: leaves the state as it is


def _byte_table() -> np.ndarray:
    """``table[state, byte]``: the decoder's state after one more byte (column 256: none)."""
    t = np.full((STATES, 257), REJECT, dtype=np.uint8)
    t[:, _PAD] = np.arange(STATES)
    t[BOUNDARY, 0x00:0x80] = BOUNDARY
    t[BOUNDARY, 0xC2:0xE0] = 1
    t[BOUNDARY, 0xE1:0xF0] = 2
    t[BOUNDARY, 0xF1:0xF4] = 3
    for lead, state in ((0xE0, 4), (0xED, 5), (0xF0, 6), (0xF4, 7)):
        t[BOUNDARY, lead] = state
    for owed in (1, 2, 3):
        t[owed, 0x80:0xC0] = owed - 1
    for state, (lo, hi, then) in _NARROW.items():
        t[state, lo:hi + 1] = then
    return t


class Utf8Tokens:
    """Per-vocabulary UTF-8 tables (built once per backend, read-only after)."""

    def __init__(self, tokens: Sequence[bytes | None], vocab_size: int) -> None:
        nxt = np.full((STATES, vocab_size), REJECT, dtype=np.uint8)
        nxt[BOUNDARY] = BOUNDARY  # ASCII text, special and unused ids (the grammar decides)
        wide = [i for i, b in enumerate(tokens[:vocab_size]) if b and max(b) >= 0x80]
        if wide:
            nxt[:, wide] = _walk([tokens[i] for i in wide])
        # NOTE: a list of bytes per state: ``after`` runs per accepted token, and indexing
        # bytes gives a Python int at a fraction of a numpy scalar index
        self.next = [bytes(nxt[s]) for s in range(STATES)]
        width = (vocab_size + 31) // 32
        bits = np.zeros((STATES, width * 32), dtype=bool)
        bits[:, :vocab_size] = nxt != REJECT
        self.rows = np.packbits(bits, axis=1, bitorder="little").view(np.uint32)

    def after(self, state: int, token_id: int) -> int:
        """The state after ``token_id`` (``REJECT``: its bytes make the output invalid)."""
        row = self.next[state]
        return row[token_id] if 0 <= token_id < len(row) else BOUNDARY


def _walk(datas: list[bytes]) -> np.ndarray:
    """``out[state, i]``: the state after ``datas[i]`` from each state, all at once."""
    longest = max(map(len, datas))
    cols = np.full((len(datas), longest), _PAD, dtype=np.int16)
    for i, data in enumerate(datas):
        cols[i, :len(data)] = np.frombuffer(data, dtype=np.uint8)
    table = _byte_table()
    states = np.repeat(np.arange(STATES, dtype=np.uint8)[:, None], len(datas), axis=1)
    for c in range(longest):
        states = table[states, cols[:, c]]
    return states

"""Characters of JSON string values, counted as JSON Schema's ``minLength``/``maxLength`` count
them, for the bounds the runtime enforces (``schema/lengths.py`` says which and why).

A value's length is in code points after unescaping: ``\\n``, ``\\"`` and ``\\u00e9`` count 1
each, a multi-byte UTF-8 character 1 (counted at its lead byte, so a token that splits it
counts right). NOTE: a surrogate pair written as two ``\\u`` escapes counts 2 here, one code
point in JSON Schema: an over-count, which only forbids more (sound). ``scan`` walks bytes
inside a string from a lexical state (plain text, after a backslash, or inside ``\\uXXXX``);
the tracker (``json_track.py``) and the token tables below both use it, so the mask and the
accept check agree.

``LengthTokens`` holds, per lexical state, what each token of the vocabulary adds to an open
string before its closing quote (and whether it closes it), and packed bitmask rows of the
tokens that fit ``room`` more characters, or that do not close a string still ``need``
characters short. A row far from its bound costs nothing; one near it, a numpy AND with a
cached row. Tokens that open another string after closing (or outside) one, a few dozen, are
checked one by one on the tracker (``JsonTrack.breaks_bound``). A bound beside a pattern is
also steered clear of dead ends near the bound (``pattern_reach.py``).
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from .pattern_reach import pattern_reach
from .token_rows import among, clear_tokens, undo_if_empty

NORMAL, ESC = 0, 5  # lexical states; 1..4: hex digits of a \u escape still to come
_QUOTE, _BACKSLASH = 0x22, 0x5C
_HEX = frozenset(b"0123456789abcdefABCDEF")
_CONTINUATION = bytes(range(0x80, 0xC0))
MAX_STEERED = 4096  # tokens one row may check against a pattern's automaton (see _steer)


def scan(data: bytes, lex: int = NORMAL, start: int = 0) -> tuple[int, int, int]:
    """Walk ``data[start:]`` inside a JSON string from lexical state ``lex``: (characters it
    adds to the value, index of the closing quote or -1, lexical state after)."""
    chars, i, n = 0, start, len(data)
    while i < n:
        b = data[i]
        if lex == NORMAL:
            if b == _QUOTE:
                return chars, i, NORMAL
            if b == _BACKSLASH:
                lex = ESC  # the escape is one character, counted here
                chars += 1
            elif not 0x80 <= b < 0xC0:
                chars += 1
        elif lex == ESC:
            lex = 4 if b == 0x75 else NORMAL  # \u: four hex digits follow
        elif b in _HEX:
            lex -= 1
        else:  # not JSON (no grammar allows it): read on as plain text
            lex = NORMAL
            continue
        i += 1
    return chars, -1, lex


def value_text(raw: bytes, lex: int) -> str:
    """The characters of an open string's raw bytes so far (``lex``: the lexical state after
    them; a trailing partial escape or UTF-8 character left out)."""
    if lex == ESC:
        raw = raw[:-1]
    elif lex != NORMAL:  # a backslash, "u" and 4 - lex hex digits so far
        raw = raw[:len(raw) - (6 - lex)]
    for end in range(len(raw), max(len(raw) - 4, -1), -1):
        try:
            return json.loads(b'"' + raw[:end] + b'"')
        except ValueError:
            continue
    return ""


class LengthTokens:
    """Per-vocabulary tables for length masks (built once per engine, read-only after; the
    lazily built tables and rows are pure functions of their keys, so a race between the
    scheduler and the prefetch thread builds one twice at worst)."""

    def __init__(self, tokens: Sequence[bytes | None]) -> None:
        self.bytes = list(tokens)
        self.width = (len(self.bytes) + 31) // 32
        quotes = [b.count(b'"') if b else 0 for b in self.bytes]
        self.quote_ids = np.asarray([i for i, q in enumerate(quotes) if q], dtype=np.int64)
        # tokens that can close one string and open another (checked one by one)
        self.multi_ids = np.asarray([i for i, q in enumerate(quotes) if q > 1], dtype=np.int64)
        self._tables: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
        self._rows: dict[tuple, np.ndarray] = {}
        self.table(NORMAL)
        # the most characters one token writes into a string it opens: a bound at least this
        # large cannot be broken by a token that opens a string and leaves it open
        self.open_max = max((scan(self.bytes[t], NORMAL, self.bytes[t].index(b'"') + 1)[0]
                             for t in self.quote_ids.tolist()), default=0)

    def table(self, lex: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(characters each token adds to a string open in state ``lex`` before its closing
        quote, whether it closes it, the largest of the first)."""
        got = self._tables.get(lex)
        if got is None:
            chars = np.zeros(len(self.bytes), dtype=np.int32)
            closes = np.zeros(len(self.bytes), dtype=bool)
            for t, data in enumerate(self.bytes):
                if not data:
                    continue
                if lex == NORMAL and b'"' not in data and b"\\" not in data:
                    chars[t] = len(data.translate(None, _CONTINUATION))  # lead bytes
                    continue
                chars[t], end, _ = scan(data, lex)
                closes[t] = end >= 0
            got = self._tables[lex] = (chars, closes, int(chars.max(initial=0)))
        return got

    def far(self, lex: int, room: int | None, need: int) -> bool:
        """True when no token can break the bound: ``room`` for every token, nothing owed."""
        return need <= 0 and (room is None or room >= self.table(lex)[2])

    def fitting(self, lex: int, room: int | None, need: int) -> np.ndarray | None:
        """A packed row (uint32 words) of the tokens that keep an open string (state ``lex``)
        within ``room`` more characters and close it only with ``need`` or more; None: all."""
        rows = []
        if room is not None and room < self.table(lex)[2]:
            rows.append(self._row(lex, "room", max(room, 0)))
        if need > 0:
            rows.append(self._row(lex, "need", need))
        if len(rows) < 2:
            return rows[0] if rows else None
        return rows[0] & rows[1]

    def _row(self, lex: int, kind: str, n: int) -> np.ndarray:
        key = (lex, kind, n)
        row = self._rows.get(key)
        if row is None:
            chars, closes, _ = self.table(lex)
            ok = chars <= n if kind == "room" else ~(closes & (chars < n))
            bits = np.zeros(self.width * 32, dtype=bool)
            bits[:len(ok)] = ok
            row = np.packbits(bits, bitorder="little").view(np.uint32)
            if len(self._rows) > 4096:  # a bound on memory (rows are 4 bytes per 32 tokens)
                self._rows.clear()
            self._rows[key] = row
        return row

    def clear(self, state: Any, words: np.ndarray, min_hi: int) -> bool:
        """Clear the bits of a filled row (``words``: its uint32 view) whose token would break
        a length bound of ``state`` (a ``JsonTrack``; ``min_hi``: the smallest upper bound its
        schema marks); True if that left no token at all (then the row stays as it was: see
        ``token_rows.undo_if_empty``)."""
        before = words.copy()
        changed = False
        if state.string and state.bound is not None:
            fit = self.fitting(state.lex, *state.room_need())
            if fit is not None:
                words &= fit
                changed = True
            if state.bound[2] is not None:
                changed |= self._steer(state, words)
        ids = self.quote_ids if not state.string and min_hi < self.open_max else self.multi_ids
        bad = [t for t in among(words, ids).tolist() if state.breaks_bound(self.bytes[t])]
        clear_tokens(words, bad)
        return bool(changed or bad) and undo_if_empty(words, before)

    def _steer(self, state: Any, words: np.ndarray) -> bool:
        """Clear the tokens after which the string's pattern cannot end within its maxLength
        (``pattern_reach.py``); only tokens landing within the pattern's largest distance to
        its end are looked at, one by one (none far from the bound). True if any cleared."""
        room = state.room_need()[0]
        reach = pattern_reach(state.bound[2]) if room is not None else None
        chars, closes, top = self.table(state.lex)
        if reach is None or room >= top + reach.max_dist:
            return False
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:len(chars)].astype(bool)
        ids = np.flatnonzero(bits & ~closes & (chars > room - reach.max_dist))
        if len(ids) > MAX_STEERED:  # NOTE: a dead end stays possible (let through, then caught)
            return False
        prefix = value_text(state.raw, state.lex)
        here = reach.step(reach.start, prefix)
        cleared = False
        for t in ids.tolist() if here else ():
            data = self.bytes[t] or b""
            text = value_text(state.raw + data, scan(data, state.lex)[2])
            after = reach.step(here, text[len(prefix):])
            if after and reach.dist(after) > room - int(chars[t]):
                clear_tokens(words, (t,))
                cleared = True
        return cleared

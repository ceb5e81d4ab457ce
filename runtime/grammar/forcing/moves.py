"""The moves of the shortest-completion search (``shortest.py``): from a matcher's state, the
token runs it may take next, cheapest and most JSON-like first: the forced string where the
grammar forces text, else single-character tokens in ``vocab.PRIORITY`` order (loops
deferred), else the shortest allowed token.

A mixin of ``CompletionSearch``: it holds the tokenizer facts the moves need (the alphabet of
single-character tokens, their bit positions, each token's length in bytes).
"""
from __future__ import annotations

from typing import Any, Hashable, Iterator

import numpy as np
import torch

from ..base import Grammar, StateKey, allocate_bitmask
from ..vocab import PRIORITY, token_bytes
from .search_walk import NO_KEY, try_key

_COMPLETING_TRIES = 16  # candidates checked for finishing the value in one move
_CLOSERS = "}]"  # moves that end a nesting level: finitely many, so never deferred as loops


class Moves:
    """Mixin of CompletionSearch: move generation (uses its ``tokenizer``, ``vocab_size``,
    ``stop_ids`` and ``max_tries``)."""

    def _init_moves(self, tokenizer: Any, vocab_size: int) -> None:
        ids = [_single_token(tokenizer, c) for c in PRIORITY]
        self._alphabet = [(c, i) for c, i in zip(PRIORITY, ids) if i is not None and i < vocab_size]
        chars = [c for c, _ in self._alphabet]
        self._quote_at = chars.index('"') if '"' in chars else None
        self._text_at = np.array([k for k, c in enumerate(chars) if c.isalnum()], dtype=np.int64)
        # the order where a quote would open a key or an item: closers first (see ``_moves``)
        self._closers_first = sorted(range(len(chars)), key=lambda k: chars[k] != "}"
                                     and chars[k] != "]")
        alpha = np.array([i for _, i in self._alphabet], dtype=np.int64)
        # numpy, not torch: small CPU ops per expansion (see ``allocate_bitmask``)
        self._words, self._shifts = alpha // 32, (alpha % 32).astype(np.uint32)
        # NOTE: built now, not on first need: the first search to need it stalled a decode
        # step by the 0.2 s token_bytes takes at a 128k vocabulary (shared with the backend's)
        big = 1 << 20  # special tokens: never the shortest
        self._lengths = torch.tensor([len(b) if b else big for b in
                                      token_bytes(tokenizer, vocab_size)], dtype=torch.int32)

    def _moves(self, grammar: Grammar, loops: set, here: Hashable = None,
               ) -> Iterator[tuple[tuple[int, ...], int, StateKey | None]]:
        """(token ids, cost in tokens, state key after them) for each move out of here, lazily
        (a depth-first walk usually needs the first). Moves into a state of equal ``full`` key
        are one move; moves whose ``local`` key is in ``loops`` come after all others: first
        one back to an earlier state on the path, then one staying in ``here`` (the local key
        of this state)."""
        forced = self._forced_move(grammar)
        if forced is not None:
            yield forced
            return
        row = allocate_bitmask(1, self.vocab_size)
        grammar.fill_bitmask(row, 0)
        bits = (row[0].numpy().view(np.uint32)[self._words] >> self._shifts) & 1
        allowed = bits.tolist()
        candidates = [tid for (_, tid), ok in zip(self._alphabet, allowed) if ok]
        # NOTE: the finishing check accepts and rolls back each candidate (a few microseconds
        # each, per expansion); a value ends on a closer, a digit or an early letter far more
        # often than on a late one, and a later character is still found one expansion on.
        done = self._completing(grammar, candidates[:_COMPLETING_TRIES])
        if done is not None:  # one character finishes the value: nothing is shorter
            yield done
            return
        yield from self._char_moves(grammar, row, bits, allowed, loops, here)

    def _forced_move(self, grammar: Grammar) -> tuple | None:
        """The text the grammar forces from here as one move, if any and it is accepted."""
        forced = grammar.jump_forward_string()
        if not forced:
            return None
        ids = tuple(self.tokenizer.encode(forced, add_special_tokens=False))
        key = try_key(grammar, ids)
        return None if key is None else (ids, len(ids), None if key is NO_KEY else key)

    def _char_moves(self, grammar: Grammar, row: torch.Tensor, bits: np.ndarray,
                    allowed: list[int], loops: set, here: Hashable,
                    ) -> Iterator[tuple[tuple[int, ...], int, StateKey | None]]:
        """``_moves`` by one single-character token each (``allowed``: the alphabet's bits in
        this state's ``row``), loops deferred; the shortest allowed token if none is."""
        seen: set = set()
        later = []
        tries = 0
        quote = self._quote_at is not None and bool(allowed[self._quote_at])
        # NOTE: a quote where no letter or digit may come opens a key or a string item (just
        # after '{' or '['), and the first complete path is the answer: quote first, the walk
        # filled an object of optional members ("devices": {"net_a0": {"name": ""}}) and the
        # estimate overshot the budget. Inside a string a letter may come and "}" is content.
        in_string = quote and bool(bits[self._text_at].any())
        order = self._closers_first if quote and not in_string else range(len(allowed))
        for at in order:
            (char, tid), ok = self._alphabet[at], allowed[at]
            if not ok or tries >= self.max_tries:
                continue
            tries += 1
            key = try_key(grammar, (tid,))
            if key is None or key is not NO_KEY and key.full in seen:
                continue
            if key is NO_KEY:
                yield (tid,), 1, None
                continue
            seen.add(key.full)
            # NOTE: closing a container is never a loop: nested levels of one rule (any JSON
            # value) look alike locally, and deferring "}" made the walk open members forever.
            # Inside a string "}" is content: deferred as before.
            if key.local in loops and (char not in _CLOSERS or in_string):
                later.append(((tid,), 1, key))
            else:
                yield (tid,), 1, key
        if not seen and not later and not tries:
            tid = self._shortest_allowed(row)
            key = None if tid is None else try_key(grammar, (tid,))
            if key is not None:
                yield (tid,), 1, None if key is NO_KEY else key
        # NOTE: a loop back to an earlier state walks the cycle on, so that state's other
        # moves (an exit: "-v0" ending a pattern [a-z]+(-[a-z]+)*-v[0-9]+) are tried on the
        # next visit; staying here ("a" after "a") only counts, and taken first it was a
        # trap: "aaaa..." to the depth bound, then the same from every state above.
        back = [m for m in later if m[2].local != here][:1]
        yield from back + [m for m in later if m[2].local == here][:1]

    @staticmethod
    def _completing(grammar: Grammar, candidates: list[int]) -> tuple | None:
        """The first single-token move after which the value is complete, if any."""
        for tid in candidates:
            if grammar.accept_token(tid):
                done = grammar.is_completed()
                key = grammar.state_key() if done else None
                grammar.rollback(1)
                if done:
                    return (tid,), 1, key
        return None

    def _shortest_allowed(self, row: torch.Tensor) -> int | None:
        from ...layers.bitmask import unpack_bitmask

        allowed = unpack_bitmask(row, self.vocab_size)[0]
        for t in self.stop_ids:
            if t < self.vocab_size:
                allowed[t] = False
        if not bool(allowed.any()):
            return None
        lengths = torch.where(allowed, self._lengths, torch.iinfo(torch.int32).max)
        return int(torch.argmin(lengths))


def _single_token(tokenizer: Any, char: str) -> int | None:
    """The id of the one token spelling exactly ``char``, if the vocabulary has it."""
    ids = tokenizer.encode(char, add_special_tokens=False)
    if len(ids) == 1 and tokenizer.decode(ids) == char:
        return int(ids[0])
    return None

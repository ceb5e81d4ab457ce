"""Unique items of any type: JSON equality of items, and the tokens that would end (or lead only
to ending) an item of a ``uniqueItems`` array equal to an earlier one.

``json_track.JsonTrack`` keeps, per open unique array, the values of its finished items (read
by ``item_value``) and the text of the current one. An item ends at its closing quote (a
string), its closing brace or bracket (an object or array), or the first byte after it (a number
or literal: whitespace, ``,`` or ``]``; a number's end is only known there, as ``1`` may become
``12``). ``ItemTokens.clear`` clears from a filled row every token whose bytes end an item
equal to an earlier one, and *probes* the tokens after which the item could be closed as such a
repeat right away (``[1, 1`` under ``maximum: 9``; ``{"id": 1`` where ``id`` is the only
property): the inner grammar takes the token, fills a row, the row is cleared the same way, and
if nothing is left the token is cleared too (a dead end a few tokens ahead, avoided: only tokens
after which the item could still close as a repeat are followed). Where the items have a
finite domain (``item_domain.py``) every token of an item is checked instead: it must leave the
item able to become a value the array does not have, and a ``,`` needs one left, so no dead end
is reached there. Other dead ends are let through as a duplicate key is
(``token_rows.undo_if_empty``; the request's output check then fails it with the reason).

Equality is JSON Schema's: ``1`` and ``1.0`` are equal (numbers read as ``Decimal``), ``true``
is not ``1``, objects are equal whatever their key order, arrays item by item.
"""
from __future__ import annotations

import json
import threading
from decimal import Decimal
from typing import Any, Sequence

import numpy as np
import torch

from ..base import allocate_bitmask
from .token_rows import among, clear_unless_dead_end, set_ids
from ..schema.arrays import canonical

_WORDS = (b"true", b"false", b"null")
_LETTERS = frozenset(b"truefalsn")
# NOTE: tokens a probe looks ahead: "false" a letter a token needs 4; only tokens after which
# the item could still close as a repeat are followed, a handful each
PROBE_DEPTH = 4


def parse_item(raw: bytes) -> Any:
    """The canonical value of an item's text, or None if it is not (yet) one JSON value."""
    try:
        return canonical(json.loads(raw, parse_float=Decimal, parse_int=Decimal))
    except (ValueError, RecursionError):
        return None


def item_value(raw: bytes) -> Any:
    """The canonical value of a finished item's text (its bytes if it does not parse: no
    grammar lets such a text through, so it only equals itself)."""
    value = parse_item(raw)
    return ("raw", raw.strip()) if value is None else value


def closed_now(state: Any) -> Any:
    """The value the innermost open unique array's current item would have if every open
    string, literal and container in it were closed now; None if that is no JSON value, or
    the item is a string (those are checked at their closing quote)."""
    frames = state.frames
    depth = next((d for d in range(len(frames) - 1, -1, -1) if frames[d].unique), None)
    if depth is None or not frames[depth].names or frames[depth].done or \
            state.string and depth == len(frames) - 1:
        return None
    text = frames[depth].item
    if state.string:
        if state.lex != 0:  # inside an escape
            return None
        text += b'"'
    else:
        stem = text.rstrip(bytes(_LETTERS))
        tail = text[len(stem):]
        if tail:  # a literal written in part: the only word it can become
            word = next((w for w in _WORDS if w.startswith(tail)), None)
            if word is None:
                return None
            text = stem + word
    text += b"".join(b"}" if f.kind == "o" else b"]" for f in reversed(frames[depth + 1:]))
    return parse_item(text)


def watching(state: Any) -> bool:
    """True when an open unique array that has items is inside a non-string item (strings
    alone are checked by ``unique_keys.QuoteTokens``) or has a domain (``item_domain.py``:
    then every token of its item is)."""
    for d in range(len(state.frames) - 1, -1, -1):
        f = state.frames[d]
        if f.unique:
            return bool(f.names) and (f.domain is not None or
                                      not (state.string and d == len(state.frames) - 1))
    return False


def fits_domains(state: Any) -> bool:
    """False if the open item of a unique array with a domain can no longer become a value
    the array does not have (``item_domain.py``), a dead end ahead."""
    for f in state.frames:
        if f.domain is not None and f.names and not f.done and \
                not f.domain.fits(f.item, f.names):
            return False
    return True


class ItemTokens:
    """Clears a row of the tokens that end a repeated item (built once per engine from the
    vocabulary's bytes; read-only after)."""

    def __init__(self, tokens: Sequence[bytes | None], quote_ids: np.ndarray) -> None:
        self.bytes = list(tokens)
        self.quote_ids = quote_ids
        # tokens that only open a string (``"abc``): as an item of the array itself they can
        # neither end it nor make it closable (strings are checked at their closing quote)
        opens = np.zeros(len(self.bytes) + 32, dtype=bool)
        for t, b in enumerate(self.bytes):
            opens[t] = bool(b) and b.lstrip().startswith(b'"') and b.count(b'"') == 1
        self.opens_string = opens
        self._scratch = threading.local()  # per thread: one probe row per depth

    def _allowed(self, state: Any, words: np.ndarray) -> list[int]:
        """The row's tokens that can end an item or make it closable: in a string only those
        with a quote (a few hundred); outside one, those the grammar allows (few, but for
        string openings at an item's start, which are left out). Under an array with a domain
        all of them (its items are an enum's: few tokens fit)."""
        top = _innermost(state)
        domain = top is not None and top.domain is not None
        if state.string and not domain:
            return among(words, self.quote_ids).tolist()
        ids = set_ids(words)
        if state.frames and state.frames[-1].unique and not domain:
            ids = ids[~self.opens_string[ids]]
        return ids[ids < len(self.bytes)].tolist()

    def _row(self, depth: int) -> torch.Tensor:
        """A scratch row for a probe ``depth`` tokens ahead (rows of shallower probes are still
        in use; the mask prefetch thread gets its own)."""
        rows = getattr(self._scratch, "rows", None)
        if rows is None:
            rows = self._scratch.rows = {}
        if depth not in rows:
            rows[depth] = allocate_bitmask(1, len(self.bytes))
        return rows[depth]

    def clear(self, grammar: Any, state: Any, words: np.ndarray, probe: int = PROBE_DEPTH) -> bool:
        """Clear from ``words`` (a filled row's uint32 view for ``grammar``'s inner grammar in
        ``state``) the tokens that end a repeated item, and (``probe`` tokens deep) those
        after which the item can only end as one; True if that left no token (the row then
        stays as it was: a dead end, see the module doc)."""
        if not watching(state):
            return False
        bad = []
        for t in self._allowed(state, words):
            data = self.bytes[t]
            if not data:
                continue
            after, _, dup = state._run(data)
            if dup or not fits_domains(after) or probe and closed_now(after) in _names(after) \
                    and self._dead_after(grammar, after, t, probe - 1):
                bad.append(t)
        return clear_unless_dead_end(words, bad)

    def _dead_after(self, grammar: Any, after: Any, token: int, probe: int) -> bool:
        """True if, once ``grammar`` (a ``UniqueKeyGrammar``) takes ``token``, every token
        its inner grammar allows ends a repeated item (or, ``probe`` tokens deep, leads only
        to that: ``tr`` of a repeated ``true`` spelled a letter a token)."""
        inner = grammar.inner
        if not inner.accept_token(token):
            return False
        try:
            row = self._row(probe)
            inner.fill_bitmask(row, 0)
            words = row.numpy()[0].view(np.uint32)
            return self.clear(grammar, after, words, probe) or not words.any()
        finally:
            inner.rollback(1)


def _innermost(state: Any) -> Any:
    """The innermost open unique array's frame (None if none)."""
    for f in reversed(state.frames):
        if f.unique:
            return f
    return None


def _names(state: Any) -> frozenset:
    """The finished items of the innermost open unique array (an empty set if none)."""
    top = _innermost(state)
    return frozenset() if top is None else top.names


def suspicious(state: Any, data: bytes) -> bool:
    """True if ``ItemTokens.clear`` might clear a token of these bytes (the accept check then
    builds the row to know)."""
    if not watching(state):
        return False
    after, _, dup = state._run(data)
    return dup or closed_now(after) in _names(after) or not fits_domains(after)

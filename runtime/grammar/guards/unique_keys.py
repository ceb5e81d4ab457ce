"""Unique object keys and unique items for JSON grammars: a ``Grammar`` wrapper that forbids a
second member of an object with a key that object already has, and a repeated item in an array
whose schema says ``uniqueItems`` (``schema/arrays.py`` marks those; items other than strings
are handled by ``unique_items.py``).

A context-free grammar cannot say "keys differ" (xgrammar and outlines-core both allow
``{"a": 1, "a": 2}`` wherever an object takes free-form keys), and a JSON parser keeps the last
duplicate only, so ``{"a": 2, "a": 2}`` under ``minProperties: 2`` parses to one property: an
output the grammar accepted that violates the schema. The wrapper follows the JSON structure of
the accepted bytes (``json_track.JsonTrack``) and, while a key string (or an item of a marked
array) is open in a container that already has some, clears from the bitmask every token whose
closing quote would finish one the container already holds (and rejects such a token in
``accept_token``), unless no other token is possible (a dead end: the duplicate is let through,
see ``token_rows.undo_if_empty``). Only tokens containing a quote
can close a key, a few hundred in a vocabulary; their bits are read in one numpy gather, so a row
costs Python work only for the quote tokens the grammar itself allows there.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Sequence

import numpy as np
import torch

from ..base import (Grammar, StateKey, accept_token_grouped, allocate_bitmask,
                   fill_bitmask_grouped)
from .json_track import JsonTrack
from ..schema.arrays import UNIQUE_MARK
from ..schema.lengths import LENGTH_MARK, smallest_bound
from .string_chars import LengthTokens
from .token_rows import among, clear_unless_dead_end, has_token
from .unique_items import ItemTokens, suspicious

class QuoteTokens:
    """The tokens that contain a quote (built once per engine from ``vocab.token_bytes``), and
    the vocabulary's length tables (``string_chars.LengthTokens``)."""

    def __init__(self, tokens: Sequence[bytes | None]) -> None:
        self.bytes = list(tokens)
        self.lengths = LengthTokens(self.bytes)
        ids = [i for i, b in enumerate(tokens) if b and b'"' in b]
        self.ids = np.asarray(ids, dtype=np.int64)
        self.items = ItemTokens(self.bytes, self.ids)

    def clear_duplicates(self, state: JsonTrack, bitmask: torch.Tensor, row: int) -> bool:
        """Clear the bits of ``bitmask[row]`` whose token would close a duplicate key; True if
        that left no token at all (then the row stays as it was: ``token_rows.py``)."""
        if state.buf is None or not state.frames[-1].names:
            return False
        words = bitmask.numpy()[row].view(np.uint32)
        dups = [t for t in among(words, self.ids).tolist()
                if state.closes_duplicate(self.bytes[t])]
        return clear_unless_dead_end(words, dups)


class UniqueKeyGrammar(Grammar):
    """``inner`` with duplicate object keys forbidden (see the module doc), and the string
    length bounds its schema leaves to the runtime enforced (``string_chars.py``) when
    ``min_hi`` (the smallest upper bound marked) is not None."""

    def __init__(self, inner: Grammar, quotes: QuoteTokens,
                 states: list[JsonTrack] | None = None, min_hi: int | None = None) -> None:
        self.inner = inner
        self.quotes = quotes
        self.min_hi = min_hi
        self.exact_state_key = inner.exact_state_key
        # NOTE: its batch calls add per-request Python state only (each row's JsonTrack; the
        # quote tokens are read-only), so rows may go to the mask prefetch's helper thread
        # when the inner grammar's may (JSON-object mode at batch: all of them)
        self.thread_safe_batch = inner.thread_safe_batch
        self._states = states or [JsonTrack()]  # _states[i]: after i accepted tokens

    def _bytes(self, token_id: int) -> bytes:
        b = self.quotes.bytes[token_id] if token_id < len(self.quotes.bytes) else None
        return b or b""

    def _refuses(self, token_id: int) -> bool:
        """True if the token closes a duplicate key or breaks a length bound while another
        token is possible (exactly when ``fill_bitmask`` clears it)."""
        state, data = self._states[-1], self._bytes(token_id)
        if not state.closes_duplicate(data) and not (
                self.min_hi is not None and state.breaks_bound(data)) and not (
                state.root is not None and suspicious(state, data)):
            return False
        row = allocate_bitmask(1, len(self.quotes.bytes))
        self.inner.fill_bitmask(row, 0)
        self._clear(row, 0)
        words = row.numpy()[0].view(np.uint32)
        return token_id < len(self.quotes.bytes) and not has_token(words, token_id)

    def _clear(self, bitmask: torch.Tensor, row: int) -> None:
        """Clear from a row the inner grammar filled what it cannot forbid itself."""
        state = self._states[-1]
        self.quotes.clear_duplicates(state, bitmask, row)
        if state.root is not None:  # unique arrays of any item (unique_items.py)
            self.quotes.items.clear(self, state, bitmask.numpy()[row].view(np.uint32))
        if self.min_hi is not None:
            self.quotes.lengths.clear(state, bitmask.numpy()[row].view(np.uint32), self.min_hi)

    def accept_token(self, token_id: int) -> bool:
        if self._refuses(token_id) or not self.inner.accept_token(token_id):
            return False
        self._states.append(self._states[-1].advance(self._bytes(token_id)))
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.inner.fill_bitmask(bitmask, row)
        self._clear(bitmask, row)

    @classmethod
    def fill_bitmask_batch(cls, grammars: Sequence[Grammar], bitmask: torch.Tensor,
                           rows: Sequence[int]) -> None:
        fill_bitmask_grouped([g.inner for g in grammars], bitmask, rows)
        for g, row in zip(grammars, rows):
            g._clear(bitmask, row)

    @classmethod
    def accept_token_batch(cls, grammars: Sequence[Grammar],
                           token_ids: Sequence[int]) -> list[bool]:
        ok = [not g._refuses(t) for g, t in zip(grammars, token_ids)]
        idx = [i for i, good in enumerate(ok) if good]
        results = accept_token_grouped([grammars[i].inner for i in idx],
                                       [token_ids[i] for i in idx])
        for i, accepted in zip(idx, results):
            ok[i] = accepted
            if accepted:
                g = grammars[i]
                g._states.append(g._states[-1].advance(g._bytes(token_ids[i])))
        return ok

    def jump_forward_string(self) -> str:
        """The inner grammar's forced text, cut where it would break a length bound (the
        rest is then sampled under the mask: the inner grammar does not know the bound)."""
        text = self.inner.jump_forward_string()
        state = self._states[-1]
        if not text or self.min_hi is None or not state.breaks_bound(text.encode()):
            return text
        cut = len(text) - 1
        while cut > 0 and state.breaks_bound(text[:cut].encode()):
            cut -= 1
        return text[:cut]

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def is_completed(self) -> bool:
        return self.inner.is_completed()

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self.inner.rollback(num_tokens)
            del self._states[-num_tokens:]

    def state_key(self) -> StateKey | None:
        key = self.inner.state_key()
        if key is None:
            return None
        track = self._states[-1]
        summary = track.summary()
        # NOTE: the search merges states by the structure without the keys written: which
        # keys an object has only forbids a few spellings, and states apart in that alone
        # (',"a":"","b":""' vs ',"a":""') made the uniform-cost search add members of every
        # spelling before closing the object (Snowplow sp_264: >1000 expansions, cut).
        merge = (key.full, track.summary(names=False))
        return StateKey((key.local, summary[1:]), (key.full, summary), merge)

    def known_completion(self) -> Sequence[int] | None:
        return self.inner.known_completion()  # replayed through this guard by the search

    def cache_scope(self) -> Any:
        return self.inner.cache_scope()  # state_key() covers the keys written

    def copy(self) -> "UniqueKeyGrammar":
        return UniqueKeyGrammar(self.inner.copy(), self.quotes, list(self._states), self.min_hi)

    @property
    def num_accepted(self) -> int:
        return self.inner.num_accepted


@functools.lru_cache(maxsize=1024)  # per schema text: runs on the scheduler loop
def has_open_keys(kind: str, text: str) -> bool:
    """True if a JSON constraint lets an object take keys of the model's choosing, where a
    duplicate can occur: any JSON (``json_object``), ``additionalProperties`` other than
    false, ``patternProperties``, an object schema without ``properties`` or listing fewer
    than its ``minProperties``, or an empty (any value) subschema. Objects with listed
    properties only (both backends emit those in order, each once) need no guard, so the
    common closed schema pays nothing per token."""
    if kind == "json_object":
        return True
    try:
        return _open(json.loads(text))
    except ValueError:
        return True


def _open(node: Any) -> bool:
    if node is True or node == {}:
        return True
    if isinstance(node, list):
        return any(_open(v) for v in node)
    if not isinstance(node, dict):
        return False
    extra = node.get("additionalProperties")
    if "patternProperties" in node or (extra is not None and extra is not False):
        return True
    types = node.get("type")
    if (types == "object" or isinstance(types, list) and "object" in types) and \
            "properties" not in node and extra is not False:
        return True
    need = node.get("minProperties")
    listed = node.get("properties")
    if extra is not False and isinstance(need, int) and \
            need > (len(listed) if isinstance(listed, dict) else 0):
        return True  # the normalizer opens it for the keys it lacks (schema/emit.py)
    return any(_open(v) for k, v in node.items() if k not in ("enum", "const", "examples",
                                                                   "default", "required"))


def guard_keys(grammar: Grammar, key: Any, quotes: QuoteTokens | None,
               backend: str = "xgrammar") -> Grammar:
    """``grammar`` wrapped when its ``GrammarKey`` is a JSON kind with open keys, arrays of
    unique items or string lengths left to the runtime; else as is."""
    if quotes is None or key.kind not in ("json_schema", "json_object"):
        return grammar
    root = marked_schema(key.text, backend) if key.kind == "json_schema" else None
    if root is None and not has_open_keys(key.kind, key.text):
        return grammar
    return UniqueKeyGrammar(grammar, quotes, [JsonTrack(root=root)],
                            None if root is None else smallest_bound(root))


@functools.lru_cache(maxsize=256)
def marked_schema(text: str, backend: str) -> dict | None:
    """The normalized schema (what the grammar was compiled from) if it marks arrays of unique
    items or runtime string lengths, else None. Normalizing again here is cheap next to
    compiling, and cached."""
    if not any(s in text for s in (UNIQUE_MARK, '"uniqueItems"', 'Length"', LENGTH_MARK)):
        return None
    from ..schema.normalizer import normalize_schema

    try:
        root = normalize_schema(json.loads(text), backend)
    except ValueError:  # the compile failed on it too: no matcher gets here
        return None
    dumped = json.dumps(root)
    return root if UNIQUE_MARK in dumped or LENGTH_MARK in dumped else None


def build_quote_tokens(tokenizer: Any, vocab_size: int) -> QuoteTokens:
    from ..vocab import token_bytes

    return QuoteTokens(token_bytes(tokenizer, vocab_size))

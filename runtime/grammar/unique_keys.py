"""Unique object keys for JSON grammars: a ``Grammar`` wrapper that forbids a second member of an
object with a key that object already has.

A context-free grammar cannot say "keys differ" (xgrammar and outlines-core both allow
``{"a": 1, "a": 2}`` wherever an object takes free-form keys), and a JSON parser keeps the last
duplicate only, so ``{"a": 2, "a": 2}`` under ``minProperties: 2`` parses to one property: an
output the grammar accepted that violates the schema. The wrapper follows the JSON structure of
the accepted bytes (``KeyState``) and, while a key string is open in an object that already has
keys, clears from the bitmask every token whose closing quote would finish a key the object
already holds (and rejects such a token in ``accept_token``), unless no other token is
possible (a dead end: the duplicate is let through, see ``clear_duplicates``). Only tokens containing a quote
can close a key, a few hundred in a vocabulary; their bits are read in one numpy gather, so a row
costs Python work only for the quote tokens the grammar itself allows there.
"""
from __future__ import annotations

import json
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from .base import Grammar, StateKey, allocate_bitmask

_QUOTE, _BACKSLASH = 0x22, 0x5C


class KeyState(NamedTuple):
    """Where the accepted text stands. ``frames``: one per open container, ``None`` for an
    array, else ``(keys so far, expecting a key)`` for an object; ``key``: the raw bytes of the
    key string being written (None outside one); ``string``: inside any string; ``escape``: the
    previous byte in the string was an unescaped backslash."""

    frames: tuple = ()
    string: bool = False
    key: bytes | None = None
    escape: bool = False

    def advance(self, data: bytes) -> "KeyState":
        frames, string, key, escape = list(self.frames), self.string, self.key, self.escape
        for b in data:
            if string:
                if escape:
                    escape = False
                elif b == _BACKSLASH:
                    escape = True
                elif b == _QUOTE:
                    string = False
                    if key is not None:
                        keys, _ = frames[-1]
                        frames[-1] = (keys | {_decode(key)}, False)
                        key = None
                    continue
                if key is not None:
                    key += bytes((b,))
            elif b == _QUOTE:
                string = True
                if frames and frames[-1] is not None and frames[-1][1]:
                    key = b""
            elif b == 0x7B:  # {
                frames.append((frozenset(), True))
            elif b == 0x5B:  # [
                frames.append(None)
            elif b in (0x7D, 0x5D) and frames:  # } ]
                frames.pop()
            elif b == 0x2C and frames and frames[-1] is not None:  # , in an object
                frames[-1] = (frames[-1][0], True)
        return KeyState(tuple(frames), string, key, escape)

    def closes_duplicate(self, data: bytes) -> bool:
        """True if ``data`` ends the open key string with a key its object already has."""
        if self.key is None:
            return False
        keys = self.frames[-1][0]
        if not keys:
            return False
        key, escape = self.key, self.escape
        for i, b in enumerate(data):
            if escape:
                escape = False
            elif b == _BACKSLASH:
                escape = True
            elif b == _QUOTE:
                return _decode(key + data[:i]) in keys
        return False

    def summary(self) -> tuple:
        """The state as far as the future goes: an open key that is no prefix of a key its
        object has cannot collide, so all such keys are one state (shortest.py merges them)."""
        key = self.key
        if key is not None and not any(k.startswith(_decode_prefix(key)) for k in
                                       self.frames[-1][0] if isinstance(k, str)):
            key = b"*"
        return self.frames, self.string, key, self.escape


def _decode(raw: bytes) -> str | bytes:
    """A key as JSON means it (escapes resolved); the raw bytes if it does not decode."""
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return raw


def _decode_prefix(raw: bytes) -> str:
    return raw.decode("utf-8", "ignore").replace("\\", "")


class QuoteTokens:
    """The tokens that contain a quote (built once per engine from ``vocab.token_bytes``)."""

    def __init__(self, tokens: Sequence[bytes | None]) -> None:
        self.bytes = list(tokens)
        ids = [i for i, b in enumerate(tokens) if b and b'"' in b]
        self.ids = np.asarray(ids, dtype=np.int64)
        self.words, self.shifts = self.ids >> 5, (self.ids & 31).astype(np.uint32)

    def clear_duplicates(self, state: KeyState, bitmask: torch.Tensor, row: int) -> bool:
        """Clear the bits of ``bitmask[row]`` whose token would close a duplicate key; True if
        that left no token at all (then the row stays as it was: see ``dead end`` below)."""
        if state.key is None or not state.frames[-1][0]:
            return False
        words = bitmask.numpy()[row].view(np.uint32)
        allowed = self.ids[((words[self.words] >> self.shifts) & 1).astype(bool)]
        dups = [t for t in allowed.tolist() if state.closes_duplicate(self.bytes[t])]
        if not dups:
            return False
        before = words.copy()
        for t in dups:
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        if words.any():
            return False
        # NOTE: dead end: the grammar admits nothing but a key this object has (a key pattern
        # with one spelling, an enum of names all used). Sampling from an empty row would
        # abort the request; a duplicate key at least parses, and the output check in
        # tokenizer/req_state.py still fails the request if the collapsed object is invalid.
        words[:] = before
        return True


class UniqueKeyGrammar(Grammar):
    """``inner`` with duplicate object keys forbidden (see the module doc)."""

    def __init__(self, inner: Grammar, quotes: QuoteTokens,
                 states: list[KeyState] | None = None) -> None:
        self.inner = inner
        self.quotes = quotes
        self.exact_state_key = inner.exact_state_key
        self._states = states or [KeyState()]  # _states[i]: after i accepted tokens

    def _bytes(self, token_id: int) -> bytes:
        b = self.quotes.bytes[token_id] if token_id < len(self.quotes.bytes) else None
        return b or b""

    def _refuses(self, data: bytes) -> bool:
        """True if ``data`` closes a duplicate key while another token is possible."""
        if not self._states[-1].closes_duplicate(data):
            return False
        row = allocate_bitmask(1, len(self.quotes.bytes))
        self.inner.fill_bitmask(row, 0)
        return not self.quotes.clear_duplicates(self._states[-1], row, 0)

    def accept_token(self, token_id: int) -> bool:
        data = self._bytes(token_id)
        if self._refuses(data) or not self.inner.accept_token(token_id):
            return False
        self._states.append(self._states[-1].advance(data))
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.inner.fill_bitmask(bitmask, row)
        self.quotes.clear_duplicates(self._states[-1], bitmask, row)

    @classmethod
    def fill_bitmask_batch(cls, grammars: Sequence[Grammar], bitmask: torch.Tensor,
                           rows: Sequence[int]) -> None:
        groups: dict[type, tuple[list, list[int]]] = {}
        for g, row in zip(grammars, rows):
            inners, rs = groups.setdefault(type(g.inner), ([], []))
            inners.append(g.inner)
            rs.append(row)
        for inner_cls, (inners, rs) in groups.items():
            inner_cls.fill_bitmask_batch(inners, bitmask, rs)
        for g, row in zip(grammars, rows):
            g.quotes.clear_duplicates(g._states[-1], bitmask, row)

    @classmethod
    def accept_token_batch(cls, grammars: Sequence[Grammar],
                           token_ids: Sequence[int]) -> list[bool]:
        ok = [not g._refuses(g._bytes(t)) for g, t in zip(grammars, token_ids)]
        idx = [i for i, good in enumerate(ok) if good]
        groups: dict[type, list[int]] = {}
        for i in idx:
            groups.setdefault(type(grammars[i].inner), []).append(i)
        for inner_cls, members in groups.items():
            results = inner_cls.accept_token_batch([grammars[i].inner for i in members],
                                                   [token_ids[i] for i in members])
            for i, accepted in zip(members, results):
                ok[i] = accepted
                if accepted:
                    g = grammars[i]
                    g._states.append(g._states[-1].advance(g._bytes(token_ids[i])))
        return ok

    def jump_forward_string(self) -> str:
        return self.inner.jump_forward_string()

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
        summary = self._states[-1].summary()
        return StateKey((key.local, summary[1:]), (key.full, summary))

    def cache_scope(self) -> Any:
        return self.inner.cache_scope()  # state_key() covers the keys written

    def copy(self) -> "UniqueKeyGrammar":
        return UniqueKeyGrammar(self.inner.copy(), self.quotes, list(self._states))

    @property
    def num_accepted(self) -> int:
        return self.inner.num_accepted


def has_open_keys(kind: str, text: str) -> bool:
    """True if a JSON constraint lets an object take keys of the model's choosing, where a
    duplicate can occur: any JSON (``json_object``), ``additionalProperties`` other than
    false, ``patternProperties``, an object schema without ``properties``, or an empty (any
    value) subschema. Objects with listed properties only (both backends emit those in order,
    each once) need no guard, so the common closed schema pays nothing per token."""
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
    return any(_open(v) for k, v in node.items() if k not in ("enum", "const", "examples",
                                                                   "default", "required"))


def guard_keys(grammar: Grammar, key: Any, quotes: QuoteTokens | None) -> Grammar:
    """``grammar`` wrapped when its ``GrammarKey`` is a JSON kind with open keys; else as is."""
    if quotes is None or key.kind not in ("json_schema", "json_object") or \
            not has_open_keys(key.kind, key.text):
        return grammar
    return UniqueKeyGrammar(grammar, quotes)


def build_quote_tokens(tokenizer: Any, vocab_size: int) -> QuoteTokens:
    from .vocab import token_bytes

    return QuoteTokens(token_bytes(tokenizer, vocab_size))

"""outlines-core grammar backend: everything is lowered to a regex and compiled to a token-level
DFA index over the vocabulary.

JSON schemas go through ``outlines_core.json_schema.build_regex_from_schema`` (compact: no
whitespace, so output is bounded and separators are forced); EBNF is accepted only when it is
regular (``ebnf_regex.py`` lowers it); a recursive grammar is rejected at admission, saying so;
a recursive JSON ``$ref`` is unrolled a bounded number of levels (``schema_unroll.py``),
untyped values nest a bounded number of levels (``any_value.py``; also "any JSON object"), and
numeric bounds, which outlines-core ignores, are spliced in as range regexes
(``outlines_bounds.py``); string patterns are rewritten to match JSON text
(``outlines_patterns.py``). The
jump-forward string is the longest byte prefix shared by every allowed token, chained through
tokens that spell exactly that prefix; it is computed once per DFA state and cached on the
compiled grammar. Shortest completions are read from a table built with the index
(``outlines_completion.py``), not searched.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ...errors import InvalidRequestError
from ..base import (Grammar, GrammarBackend, GrammarKey, StateKey, bitmask_width,
                   choices_regex)
from .any_value import ANY_OBJECT, bound_untyped_values
from .failure_site import compile_error
from .outlines_bounds import BoundSplicer
from .outlines_completion import CompletionTable, completion_table
from .outlines_patterns import safe_patterns
from ..schema import normalize_schema
from .schema_unroll import unroll_schema_text
from ..vocab import decode_prefix, token_bytes

_WHITESPACE = ""  # compact JSON: bounded, and its separators are forced (jump-forward)
_MAX_JUMP_TOKENS = 64
# One character of a JSON string as outlines-core spells it, and the same without '\"'.
_STRING_CHAR = r'([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
_STRING_CHAR_NO_QUOTE = r'([^"\\\x00-\x1F\x7F-\x9F]|\\[\\/bfnrt])'


@dataclass
class OutlinesCompiled:
    """A DFA index plus the per-state forced-prefix cache shared by all its requests, and
    its shortest completions (None: too many states, searched instead)."""

    index: Any
    regex: str
    forced: dict[int, tuple[bytes, int | None]] = field(default_factory=dict)
    completions: CompletionTable | None = None


class OutlinesGrammar(Grammar):
    """One request's walk over an outlines-core index (a Guide plus a terminated flag, because
    a Guide cannot advance past the stop token)."""

    exact_state_key = True  # the DFA state is the whole state

    def __init__(self, backend: "OutlinesBackend", compiled: OutlinesCompiled) -> None:
        import outlines_core as oc

        self._backend = backend
        self._compiled = compiled
        self._guide = oc.Guide(compiled.index, max_rollback=1 << 20)
        self._tokens: list[int] = []  # accepted tokens except the stop token, for copy()
        self._terminated = False

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id in self._backend.eos_token_ids:
            if not self.is_completed():
                return False
            self._terminated = True
        else:
            try:
                self._guide.advance(int(token_id), return_tokens=False)
            except (ValueError, OverflowError):
                return False
            self._tokens.append(int(token_id))
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        target = bitmask[row]
        if self._terminated:
            target.zero_()
            return
        assert target.is_contiguous() and target.dtype == torch.int32
        self._guide.write_mask_into(target.data_ptr(), target.numel(), 4)
        if self.is_completed():  # the Guide knows only its own eos id; allow all stop tokens
            for t in self._backend.eos_token_ids:
                target[t // 32] |= _bit(t % 32)

    def jump_forward_string(self) -> str:
        if self._terminated:
            return ""
        data = b""
        state = self._guide.get_state()
        for _ in range(_MAX_JUMP_TOKENS):
            prefix, token = self._backend.forced_prefix(self._compiled, state)
            data += prefix
            if token is None:
                break
            state = self._compiled.index.get_next_state(state, token)
        return decode_prefix(data)

    def known_completion(self) -> tuple[int, ...] | None:
        table = self._compiled.completions
        if self._terminated or table is None:
            return None
        return table.path(self._guide.get_state())

    def is_terminated(self) -> bool:
        return self._terminated

    def is_completed(self) -> bool:
        return self._terminated or self._guide.is_finished()

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if num_tokens > self.num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} of {self.num_accepted} tokens")
        if self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            self._guide.rollback_state(num_tokens)
            del self._tokens[-num_tokens:]

    def state_key(self) -> StateKey:
        state = (self._guide.get_state(), self._terminated)
        return StateKey(state, state)

    def cache_scope(self) -> Any:
        return self._compiled

    def copy(self) -> "OutlinesGrammar":
        # NOTE: a pickled Guide loses its rollback depth, so a copy replays the tokens instead.
        other = OutlinesGrammar(self._backend, self._compiled)
        for t in self._tokens:
            other._guide.advance(t, return_tokens=False)
        other._tokens = list(self._tokens)
        other._terminated = self._terminated
        return other

    @property
    def num_accepted(self) -> int:
        return len(self._tokens) + int(self._terminated)


def prepare_schema(text: str) -> str:
    """The schema outlines-core compiles: recursion unrolled, untyped values bounded."""
    # NOTE: outlines-core's own unrolling of a recursive $ref is unsound at its depth limit (a
    # required "next" leaves '{"v":1,}'), and its any-value regex can take minutes to index.
    schema = json.loads(unroll_schema_text(text))
    return json.dumps(bound_untyped_values(schema))


def _bit(i: int) -> int:
    """Bit ``i`` of an int32 word as a signed Python int (bit 31 is negative)."""
    return -(1 << 31) if i == 31 else 1 << i


class OutlinesBackend(GrammarBackend):
    """Builds the outlines-core vocabulary once; compiles keys to DFA indexes."""

    name = "outlines"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        import outlines_core as oc

        super().__init__(vocab_size, eos_token_ids)
        self._oc = oc
        self._bytes = token_bytes(tokenizer, vocab_size)
        mapping: dict[bytes, list[int]] = {}
        for i, b in enumerate(self._bytes):
            if b and i not in self.eos_token_ids:
                mapping.setdefault(b, []).append(i)
        self._by_bytes = {b: ids[0] for b, ids in mapping.items()}
        self._vocab = oc.Vocabulary(self.eos_token_ids[0], mapping)
        self.width = bitmask_width(vocab_size)
        from ..vocab import PRIORITY

        # the completion table's moves: the search's single-character tokens, in its order
        self._alphabet = [self._by_bytes[c.encode()] for c in PRIORITY
                          if c.encode() in self._by_bytes]

    def to_regex(self, key: GrammarKey) -> str:
        """Lower a key to the regex outlines compiles."""
        schema_to_regex = self._oc.json_schema.build_regex_from_schema
        if key.kind == "regex":
            return key.text
        if key.kind == "choices":
            return choices_regex(json.loads(key.text))
        if key.kind == "json_object":
            return schema_to_regex(json.dumps(ANY_OBJECT), _WHITESPACE)
        if key.kind == "json_schema":
            bounds = BoundSplicer(key.text)
            normalized = bounds.swap(safe_patterns(normalize_schema(json.loads(key.text),
                                                                    self.name)))
            regex = bounds.splice(schema_to_regex(prepare_schema(json.dumps(normalized)),
                                                  _WHITESPACE))
            # NOTE: with the escaped quote allowed, indexing a length-bounded string grows
            # exponentially with the bound (maxLength 20: ~80 s, 40: hours); without it, 40 takes
            # 0.4 s. Dropping one escape from bounded strings keeps every output valid.
            return regex.replace(_STRING_CHAR + "{", _STRING_CHAR_NO_QUOTE + "{")
        from .ebnf_regex import ebnf_to_regex

        return ebnf_to_regex(key.text)

    def compile(self, key: GrammarKey) -> OutlinesCompiled:
        try:
            regex = self.to_regex(key)
            index = self._oc.Index(regex, self._vocab)
            return OutlinesCompiled(index, regex,
                                    completions=completion_table(index, self._alphabet))
        except InvalidRequestError:
            raise
        except Exception as e:  # outlines-core raises ValueError/TypeError/RuntimeError
            raise compile_error(self.name, key, e,
                                lambda k: self._oc.Index(self.to_regex(k), self._vocab),
                                str(e).strip()[:500]) from e

    def new_grammar(self, compiled: OutlinesCompiled) -> OutlinesGrammar:
        return OutlinesGrammar(self, compiled)

    def forced_prefix(self, compiled: OutlinesCompiled, state: int) -> tuple[bytes, int | None]:
        """(bytes every allowed token starts with, the token spelling exactly them or None)."""
        hit = compiled.forced.get(state)
        if hit is not None:
            return hit
        allowed = compiled.index.get_allowed_tokens(state) or []
        result: tuple[bytes, int | None] = (b"", None)
        if not any(t in self.eos_token_ids for t in allowed):
            pieces = [self._bytes[t] for t in allowed if self._bytes[t]]
            prefix = os.path.commonprefix(pieces) if pieces else b""
            token = self._by_bytes.get(prefix) if prefix else None
            result = (prefix, token if token in set(allowed) else None)
        compiled.forced[state] = result
        return result

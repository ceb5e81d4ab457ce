"""xgrammar (the default grammar backend): JSON schema, any-JSON, regex, EBNF/GBNF, choices.

xgrammar compiles to a pushdown automaton with precomputed token masks; its matcher
(``xgrammar_matcher.py``) fills a bitmask row in native code and finds jump-forward strings
itself. JSON is compiled with ``any_whitespace=False`` (fixed separators) so a model cannot
stall in endless whitespace. What a compile worker sends back is ``xgrammar_transfer.py``'s.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...errors import InvalidRequestError
from ..base import GrammarBackend, GrammarKey, choices_regex
from .failure_site import compile_error
from ..schema import normalize_schema
from ..guards.utf8_tokens import Utf8Tokens
from ..vocab import token_bytes
from .xgrammar_matcher import XGrammarGrammar
from .xgrammar_transfer import XGrammarPayload, worth_serializing

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class XGrammarCompiled:
    """xgrammar's compiled grammar, the vocabulary's UTF-8 tables and, per UTF-8 state, the
    packed row every filled row is ANDed with (JSON kinds: without control characters)."""

    grammar: Any
    json: bool
    utf8: Utf8Tokens
    filters: np.ndarray  # [utf8_tokens.STATES, bitmask width] uint32
    # the call that compiled it, (xgrammar call, its text): what a compile worker ships
    # (see ``XGrammarBackend.ship``)
    source: tuple[str, str] | None = None
    compile_s: float = 0.0  # xgrammar's compile (not the normalizer's); 0: deserialized


class XGrammarBackend(GrammarBackend):
    """Compiles keys with one ``xgrammar.GrammarCompiler`` (one per compile worker process)."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int],
                 compile_threads: int = 1) -> None:
        import xgrammar as xgr

        super().__init__(vocab_size, eos_token_ids)
        self._xgr = xgr
        self._info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(self.eos_token_ids))
        # NOTE: our own cache (compiler.py) is keyed by the request text; xgrammar's would only
        # duplicate it without a bound, so it is off.
        self._threads = compile_threads
        self._local = threading.local()  # its GrammarCompiler per thread (_thread_compiler)
        tokens = token_bytes(tokenizer, vocab_size)
        self._utf8 = Utf8Tokens(tokens, vocab_size)
        self._filters = {False: self._utf8.rows,
                         True: self._utf8.rows & _json_safe_row(tokens, vocab_size)}

    def compile(self, key: GrammarKey) -> XGrammarCompiled:
        grammar, source, seconds = self._compile(key)
        # NOTE: xgrammar's JSON strings admit raw control characters (a byte-level token such as
        # "\x03"), which JSON forbids; masking those tokens out keeps every output parseable.
        return self._wrap(grammar, key.kind in ("json_schema", "json_object"), source, seconds)

    def _wrap(self, grammar: Any, json_kind: bool, source: tuple[str, str] | None = None,
              compile_s: float = 0.0) -> XGrammarCompiled:
        return XGrammarCompiled(grammar, json_kind, self._utf8, self._filters[json_kind],
                                source, compile_s)

    def _compile(self, key: GrammarKey) -> tuple[Any, tuple[str, str], float]:
        """(xgrammar's compiled grammar, its source, seconds xgrammar took)."""
        try:
            source = _source(key)
            t0 = time.perf_counter()
            return self._call(*source), source, time.perf_counter() - t0
        except InvalidRequestError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/ValueError subclasses
            raise compile_error(self.name, key, e, self._build, _first_line(e)) from e

    def _build(self, key: GrammarKey) -> Any:
        return self._call(*_source(key))

    def _call(self, call: str, text: str) -> Any:
        c = self._thread_compiler()
        if call == "json":
            return c.compile_json_schema(text, any_whitespace=False)
        if call == "json_object":
            # Any JSON object, any keys: strict_mode off allows unlisted properties.
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                         strict_mode=False)
        if call == "regex":
            return c.compile_regex(text)
        return c.compile_grammar(text)

    def _thread_compiler(self) -> Any:
        """This thread's ``xgrammar.GrammarCompiler`` (the compile pool's threads receive at
        once; a compiler is only a handle on the shared tokenizer tables, made in ~0.1 ms)."""
        c = getattr(self._local, "compiler", None)
        if c is None:
            c = self._local.compiler = self._xgr.GrammarCompiler(
                self._info, max_threads=self._threads, cache_enabled=False)
        return c

    ships_again = True

    def ship(self, compiled: XGrammarCompiled) -> bytes:
        """In the worker: the compile's source (the parent may compile it again: the worker
        has just shown it fits the deadline and memory budget)."""
        if compiled.source is None:  # loaded from its serialized form: no source to ship
            return self.serialize(compiled)
        return XGrammarPayload(compiled.json, compiled.source).pack()

    def may_ship_again(self, compiled: XGrammarCompiled) -> bool:
        return compiled.source is not None and worth_serializing(
            compiled.compile_s, compiled.grammar.memory_size_bytes)

    def ship_again(self, compiled: XGrammarCompiled) -> bytes | None:
        """For the on-disk cache, asked once the source was delivered: the serialized grammar
        with its source, where loading that is expected to cost less than compiling again
        (``xgrammar_transfer.py``); None otherwise."""
        if not self.may_ship_again(compiled):
            return None
        return XGrammarPayload(compiled.json, compiled.source,
                               compiled.grammar.serialize_json()).pack()

    def receive(self, data: bytes) -> XGrammarCompiled:
        """``ship``'s bytes, here: the serialized grammar deserialized if it came (and is
        intact, of this xgrammar and this tokenizer), else the source compiled again."""
        payload = XGrammarPayload.unpack(data)
        if payload.serialized is not None:
            try:
                grammar = self._xgr.CompiledGrammar.deserialize_json(payload.serialized,
                                                                     self._info)
                return self._wrap(grammar, payload.json_kind, payload.source)
            except Exception as e:  # noqa: BLE001 - version, tokenizer or format mismatch
                if payload.source is None:
                    raise
                logger.warning("xgrammar: a compiled grammar does not load (%s); compiling "
                               "its source here instead", _first_line(e))
        elif payload.damaged:
            logger.warning("xgrammar: a compiled grammar arrived damaged (digest mismatch); "
                           "compiling its source here instead")
        assert payload.source is not None
        t0 = time.perf_counter()
        grammar = self._call(*payload.source)
        return self._wrap(grammar, payload.json_kind, payload.source,
                          time.perf_counter() - t0)

    def compiled_bytes(self, compiled: XGrammarCompiled, shipped: bytes) -> int:
        return int(compiled.grammar.memory_size_bytes)

    def serialize(self, compiled: XGrammarCompiled) -> bytes:
        # xgrammar's own format leaves the tokenizer tables out (the parent has them).
        kind = b"j" if compiled.json else b"-"
        return kind + compiled.grammar.serialize_json().encode("utf-8")

    def deserialize(self, data: bytes) -> XGrammarCompiled:
        grammar = self._xgr.CompiledGrammar.deserialize_json(data[1:].decode("utf-8"),
                                                             self._info)
        return self._wrap(grammar, data[:1] == b"j")

    def new_grammar(self, compiled: XGrammarCompiled) -> XGrammarGrammar:
        matcher = self._xgr.GrammarMatcher(compiled.grammar,
                                           override_stop_tokens=list(self.eos_token_ids))
        return XGrammarGrammar(matcher, compiled)


def _source(key: GrammarKey) -> tuple[str, str]:
    """(xgrammar call, its text) for ``key``: a JSON schema normalized first."""
    if key.kind == "json_schema":
        return "json", json.dumps(normalize_schema(json.loads(key.text), "xgrammar"))
    if key.kind == "choices":
        return "regex", choices_regex(json.loads(key.text))
    return key.kind, key.text


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[-1][:500] if "\n" in text else text[:500]


def _json_safe_row(tokens: Sequence[bytes | None], vocab_size: int) -> np.ndarray:
    """One packed bitmask row (uint32) allowing every token except those containing a byte
    below 0x20."""
    from ..base import allocate_bitmask
    from ..guards.token_rows import clear_tokens

    row = allocate_bitmask(1, vocab_size)[0].numpy().view(np.uint32).copy()
    clear_tokens(row, [i for i, data in enumerate(tokens[:vocab_size])
                       if data is not None and any(b < 0x20 for b in data)])
    return row

"""xgrammar (the default grammar backend): JSON schema, any-JSON, regex, EBNF/GBNF, choices.

xgrammar compiles to a pushdown automaton with precomputed token masks; its matcher fills a
bitmask row in native code and finds jump-forward strings itself. JSON is compiled with
``any_whitespace=False`` (fixed separators) so a model cannot stall in endless whitespace.
Each matcher also keeps the output valid UTF-8, which xgrammar does not (``utf8_tokens.py``).
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ...errors import InvalidRequestError
from ..base import (Grammar, GrammarBackend, GrammarKey, StateKey, accept_positions,
                   choices_regex)
from .failure_site import failure_site, site_message
from ..schema import normalize_schema
from ..guards.token_rows import undo_if_empty
from ..guards.utf8_tokens import BOUNDARY, REJECT, Utf8Tokens
from ..vocab import token_bytes
from .xgrammar_threads import (MIN_ACCEPT_CHUNK, MIN_THREADED_ACCEPT, MIN_THREADED_TOKENS,
                               accept_pool, and_rows, batch_accept, batch_filler,
                               fill_threads, spans_by_weight)

_STEPS = re.compile(r"There are (\d+) steps")
_START = re.compile(r"(?<=rule_start_pos=)(\d+)")  # -1 (the root rule) stays as it is


class XGrammarGrammar(Grammar):
    """One request's xgrammar matcher, and the UTF-8 state after each token it accepted
    (``utf8_tokens.py``: a token that would make the output invalid UTF-8 is refused)."""

    exact_state_key = False
    thread_safe_batch = True  # xgrammar's batch calls release the GIL

    def __init__(self, matcher: Any, compiled: "XGrammarCompiled", accepted: int = 0,
                 utf8: bytearray | None = None) -> None:
        self._matcher = matcher
        self._compiled = compiled
        self._accepted = accepted
        self._utf8 = utf8 if utf8 is not None else bytearray([BOUNDARY])

    def _after(self, token_id: int) -> int:
        return self._compiled.utf8.after(self._utf8[-1], int(token_id))

    def accept_token(self, token_id: int) -> bool:
        state = self._after(token_id)
        if state == REJECT or not self._matcher.accept_token(int(token_id)):
            return False
        self._accepted += 1
        self._utf8.append(state)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)
        # NOTE: numpy: a torch op on a CPU row wakes the intra-op thread pool (255 us per
        # row on the H100 host, against a few us here; the completion search fills rows)
        _filter_row(bitmask.numpy(), row, self._compiled.filters, self._utf8[-1])

    @classmethod
    def fill_bitmask_batch(cls, grammars: Sequence[Grammar], bitmask: torch.Tensor,
                           rows: Sequence[int]) -> None:
        """All rows in xgrammar's thread pool (native code, no per-row Python); the filter
        rows (UTF-8 at a character boundary, JSON's control characters) then run once over
        the rows of each, a row inside a character on its own."""
        rows = list(rows)
        batch_filler().batch_fill_next_token_bitmask([g._matcher for g in grammars], bitmask, rows)
        words = bitmask.numpy()
        groups: dict[int, tuple[np.ndarray, list[int]]] = {}
        for g, r in zip(grammars, rows):
            state, filters = g._utf8[-1], g._compiled.filters
            if state != BOUNDARY:
                _filter_row(words, r, filters, state)
            else:
                groups.setdefault(id(filters), (filters[BOUNDARY], []))[1].append(r)
        for filt, group in groups.values():
            and_rows(words, sorted(group), filt.view(np.int32))

    @classmethod
    def accept_token_batch(cls, grammars: Sequence[Grammar],
                           token_ids: Sequence[int]) -> list[bool]:
        # NOTE: at least MIN_ACCEPT_CHUNK rows per task: 50 rows are 4 tasks, not 1 (the
        # rows measured by the completion tracker are accepted on the path to the sampling
        # launch: ~2 ms in one call on the H100 host at 256 rows)
        if len(grammars) < MIN_THREADED_ACCEPT or fill_threads() == 1:
            return _accept_native(grammars, token_ids)
        chunk = max(MIN_ACCEPT_CHUNK, -(-len(grammars) // fill_threads()))
        spans = [(i, i + chunk) for i in range(0, len(grammars), chunk)]
        # NOTE: xgrammar releases the GIL in native calls: chunks run in parallel
        return [ok for part in accept_pool().map(
            lambda s: _accept_native(grammars[s[0]:s[1]], token_ids[s[0]:s[1]]), spans)
            for ok in part]

    @classmethod
    def accept_tokens_batch(cls, grammars: Sequence[Grammar],
                            token_lists: Sequence[Sequence[int]]) -> list[bool]:
        """Each task of the accept pool takes a share of the rows through all their token
        positions (one pool round trip per task, not per position).

        NOTE: jump-forward accepts ~40 requests' forced text at once at 256 decoding rows,
        ~7 tokens each at 14-30 us per token: 4-9 ms one position at a time on the
        scheduler thread (H100 host), which the step waited for."""
        total = sum(len(ids) for ids in token_lists)
        tasks = min(fill_threads(), len(grammars), total // MIN_THREADED_TOKENS)
        if tasks < 2:
            return accept_positions(grammars, token_lists, _accept_native)
        spans = spans_by_weight([len(ids) for ids in token_lists], tasks)
        return [ok for part in accept_pool().map(
            lambda s: accept_positions(grammars[s[0]:s[1]], token_lists[s[0]:s[1]],
                                       _accept_native), spans) for ok in part]

    def jump_forward_string(self) -> str:
        # NOTE: inside a character the rest of it is bytes, not text: sampled instead
        if self._utf8[-1] != BOUNDARY:
            return ""
        return self._matcher.find_jump_forward_string()

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def is_completed(self) -> bool:
        return self._matcher.is_completed()

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._matcher.rollback(num_tokens)
            self._accepted -= num_tokens
            del self._utf8[-num_tokens:]

    def state_key(self) -> StateKey:
        # NOTE: from the parser's newest Earley state set: ``local`` drops the rules' start
        # positions, ``full`` keeps them relative to now (repetition counts live there). The
        # older chart is left out, so neither is exact (``exact_state_key = False``).
        text = self._matcher._debug_print_internal_state()
        done = self._matcher.is_completed()
        key = _STATE_KEYS.get((text, done))
        if key is None:  # NOTE: lockstep requests reach the same states at the same step
            key = _STATE_KEYS[text, done] = _state_key(text, done)
            if len(_STATE_KEYS) > 4096:  # oldest out (pop: the helper thread may too)
                _STATE_KEYS.pop(next(iter(_STATE_KEYS), None), None)
        state = self._utf8[-1]  # inside a character: which bytes may follow is ours to say
        return key if state == BOUNDARY else StateKey((state, key.local), (state, key.full))

    def cache_scope(self) -> Any:
        return self._compiled

    def copy(self) -> "XGrammarGrammar":
        return XGrammarGrammar(self._matcher.fork(), self._compiled, self._accepted,
                               bytearray(self._utf8))

    @property
    def num_accepted(self) -> int:
        return self._accepted


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


class XGrammarBackend(GrammarBackend):
    """Compiles keys with one ``xgrammar.GrammarCompiler`` (one per compile worker process)."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int],
                 compile_threads: int = 1) -> None:
        import xgrammar as xgr

        super().__init__(vocab_size, eos_token_ids)
        self._xgr = xgr
        self._info = info = xgr.TokenizerInfo.from_huggingface(
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
        grammar, source = self._compile(key)
        # NOTE: xgrammar's JSON strings admit raw control characters (a byte-level token such as
        # "\x03"), which JSON forbids; masking those tokens out keeps every output parseable.
        return self._wrap(grammar, key.kind in ("json_schema", "json_object"), source)

    def _wrap(self, grammar: Any, json_kind: bool,
              source: tuple[str, str] | None = None) -> XGrammarCompiled:
        return XGrammarCompiled(grammar, json_kind, self._utf8, self._filters[json_kind],
                                source)

    def _compile(self, key: GrammarKey) -> tuple[Any, tuple[str, str]]:
        """(xgrammar's compiled grammar, its source)."""
        try:
            source = _source(key)
            return self._call(*source), source
        except InvalidRequestError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/ValueError subclasses
            if key.kind == "json_schema":  # name the keyword and path that failed
                site = failure_site(json.loads(key.text), lambda sub: self._build(
                    GrammarKey("json_schema", json.dumps(sub))))
                raise InvalidRequestError(site_message(self.name, site, e),
                                          field=key.field) from e
            raise InvalidRequestError(
                f"xgrammar cannot compile this {key.field}: {_first_line(e)}",
                field=key.field) from e

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

    def ship(self, compiled: XGrammarCompiled) -> bytes:
        """The compile's source, not the compiled grammar: xgrammar serializes its token-mask
        tables as JSON text, which on the real-world schemas cost 3-30x the compile (a 1.4 MB
        grammar became 43 MB of JSON in 7.4 s, parsed back in 2.3 s) and on some ran past
        6 GB (benchmarks/RESULTS.md, "Compile admission"). Compiling the source again here
        (``receive``) costs what the worker's compile did, and is safe: the worker just
        finished the same compile within its deadline and memory budget."""
        if compiled.source is None:  # loaded from its serialized form: no source to ship
            return self.serialize(compiled)
        kind = b"j" if compiled.json else b"-"
        return kind + json.dumps(compiled.source).encode("utf-8")

    def receive(self, data: bytes) -> XGrammarCompiled:
        """``ship``'s bytes: a source (a JSON list) is compiled here, a serialized grammar
        (``serialize``'s JSON object, e.g. an older disk-cache file) deserialized."""
        if data[1:2] != b"[":
            return self.deserialize(data)
        call, text = json.loads(data[1:].decode("utf-8"))
        return self._wrap(self._call(call, text), data[:1] == b"j", (call, text))

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


_STATE_KEYS: dict[tuple[str, bool], StateKey] = {}  # (debug text, completed) -> key


def _source(key: GrammarKey) -> tuple[str, str]:
    """(xgrammar call, its text) for ``key``: a JSON schema normalized first."""
    if key.kind == "json_schema":
        return "json", json.dumps(normalize_schema(json.loads(key.text), "xgrammar"))
    if key.kind == "choices":
        return "regex", choices_regex(json.loads(key.text))
    return key.kind, key.text


def _state_key(text: str, done: bool) -> StateKey:
    head, _, states = text.partition("Last step:")
    steps = _STEPS.search(head)
    now = int(steps.group(1)) if steps else 0
    full = _START.sub(lambda m: str(now - int(m.group(1))), states)
    return StateKey((done, _START.sub("", states)), (done, full))


def _accept_native(grammars: Sequence[Grammar], token_ids: Sequence[int]) -> list[bool]:
    """One native batch accept on the calling thread (a token that would make the output
    invalid UTF-8 is refused before it reaches xgrammar)."""
    states = [g._after(t) for g, t in zip(grammars, token_ids)]
    go = [i for i, s in enumerate(states) if s != REJECT]
    oks = [False] * len(grammars)
    done = batch_accept([grammars[i]._matcher for i in go],
                        [int(token_ids[i]) for i in go]) if go else []
    for i, ok in zip(go, done):
        if ok:
            oks[i] = True
            grammars[i]._accepted += 1
            grammars[i]._utf8.append(states[i])
    return oks


def _filter_row(words: np.ndarray, row: int, filters: np.ndarray, state: int) -> None:
    """``words[row] &= filters[state]``; inside a character, a row that leaves empty stays as
    it was (``token_rows.undo_if_empty``: the sampled token is then refused by the accept)."""
    view = words[row].view(np.uint32)
    before = view.copy() if state != BOUNDARY else None
    view &= filters[state]
    if before is not None:
        undo_if_empty(view, before)


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

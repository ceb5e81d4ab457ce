"""xgrammar (the default grammar backend): JSON schema, any-JSON, regex, EBNF/GBNF, choices.

xgrammar compiles to a pushdown automaton with precomputed token masks; its matcher fills a
bitmask row in native code and finds jump-forward strings itself. JSON is compiled with
``any_whitespace=False`` (fixed separators) so a model cannot stall in endless whitespace.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import InvalidRequestError
from .base import (Grammar, GrammarBackend, GrammarKey, StateKey, accept_positions,
                   choices_regex)
from .schema import normalize_schema

_STEPS = re.compile(r"There are (\d+) steps")
_START = re.compile(r"(?<=rule_start_pos=)(\d+)")  # -1 (the root rule) stays as it is


class XGrammarGrammar(Grammar):
    """One request's xgrammar matcher."""

    exact_state_key = False
    thread_safe_batch = True  # xgrammar's batch calls release the GIL

    def __init__(self, matcher: Any, compiled: "XGrammarCompiled", accepted: int = 0) -> None:
        self._matcher = matcher
        self._compiled = compiled
        self._accepted = accepted

    def accept_token(self, token_id: int) -> bool:
        ok = self._matcher.accept_token(int(token_id))
        self._accepted += int(ok)
        return ok

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)
        if self._compiled.json_safe is not None:
            # NOTE: numpy: a torch op on a CPU row wakes the intra-op thread pool (255 us per
            # row on the H100 host, against a few us here; the completion search fills rows)
            words = bitmask.numpy()[row]
            words &= self._compiled.json_safe.numpy()

    @classmethod
    def fill_bitmask_batch(cls, grammars: Sequence[Grammar], bitmask: torch.Tensor,
                           rows: Sequence[int]) -> None:
        """All rows in xgrammar's thread pool (native code, no per-row Python); the JSON
        control-character filter then runs once over the rows that need it."""
        rows = list(rows)
        _batch_filler().batch_fill_next_token_bitmask([g._matcher for g in grammars], bitmask, rows)
        safe = [(r, g._compiled.json_safe) for g, r in zip(grammars, rows)
                if g._compiled.json_safe is not None]
        if not safe:
            return
        words = bitmask.numpy()
        for filt in {id(f): f for _, f in safe}.values():
            _and_rows(words, sorted(r for r, f in safe if f is filt), filt.numpy())

    @classmethod
    def accept_token_batch(cls, grammars: Sequence[Grammar],
                           token_ids: Sequence[int]) -> list[bool]:
        # NOTE: at least _MIN_ACCEPT_CHUNK rows per task: 50 rows are 4 tasks, not 1 (the
        # rows measured by the completion tracker are accepted on the path to the sampling
        # launch: ~2 ms in one call on the H100 host at 256 rows)
        if len(grammars) < _MIN_THREADED_ACCEPT or _fill_threads() == 1:
            return _accept_native(grammars, token_ids)
        chunk = max(_MIN_ACCEPT_CHUNK, -(-len(grammars) // _fill_threads()))
        spans = [(i, i + chunk) for i in range(0, len(grammars), chunk)]
        # NOTE: xgrammar releases the GIL in native calls: chunks run in parallel
        return [ok for part in _accept_pool().map(
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
        tasks = min(_fill_threads(), len(grammars), total // _MIN_THREADED_TOKENS)
        if tasks < 2:
            return accept_positions(grammars, token_lists, _accept_native)
        spans = _spans_by_weight([len(ids) for ids in token_lists], tasks)
        return [ok for part in _accept_pool().map(
            lambda s: accept_positions(grammars[s[0]:s[1]], token_lists[s[0]:s[1]],
                                       _accept_native), spans) for ok in part]

    def jump_forward_string(self) -> str:
        return self._matcher.find_jump_forward_string()

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def is_completed(self) -> bool:
        return self._matcher.is_completed()

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0:
            self._matcher.rollback(num_tokens)
            self._accepted -= num_tokens

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
        return key

    def cache_scope(self) -> Any:
        return self._compiled

    def copy(self) -> "XGrammarGrammar":
        return XGrammarGrammar(self._matcher.fork(), self._compiled, self._accepted)

    @property
    def num_accepted(self) -> int:
        return self._accepted


@dataclass(frozen=True)
class XGrammarCompiled:
    """xgrammar's compiled grammar; JSON kinds also carry the control-character filter row."""

    grammar: Any
    json_safe: torch.Tensor | None = None


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
        self._compiler = xgr.GrammarCompiler(info, max_threads=compile_threads,
                                             cache_enabled=False)
        self._json_safe = _json_safe_row(tokenizer, vocab_size)

    def compile(self, key: GrammarKey) -> XGrammarCompiled:
        compiled = self._compile(key)
        # NOTE: xgrammar's JSON strings admit raw control characters (a byte-level token such as
        # "\x03"), which JSON forbids; masking those tokens out keeps every output parseable.
        json_kind = key.kind in ("json_schema", "json_object")
        return XGrammarCompiled(compiled, self._json_safe if json_kind else None)

    def _compile(self, key: GrammarKey) -> Any:
        c = self._compiler
        try:
            if key.kind == "json_schema":
                schema = normalize_schema(json.loads(key.text), self.name)
                return c.compile_json_schema(json.dumps(schema), any_whitespace=False)
            if key.kind == "json_object":
                # Any JSON object, any keys: strict_mode off allows unlisted properties.
                return c.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                             strict_mode=False)
            if key.kind == "regex":
                return c.compile_regex(key.text)
            if key.kind == "ebnf":
                return c.compile_grammar(key.text)
            return c.compile_regex(choices_regex(json.loads(key.text)))
        except InvalidRequestError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/ValueError subclasses
            raise InvalidRequestError(
                f"xgrammar cannot compile this {key.field}: {_first_line(e)}",
                field=key.field) from e

    def serialize(self, compiled: XGrammarCompiled) -> bytes:
        # xgrammar's own format leaves the tokenizer tables out (the parent has them).
        kind = b"j" if compiled.json_safe is not None else b"-"
        return kind + compiled.grammar.serialize_json().encode("utf-8")

    def deserialize(self, data: bytes) -> XGrammarCompiled:
        grammar = self._xgr.CompiledGrammar.deserialize_json(data[1:].decode("utf-8"),
                                                             self._info)
        return XGrammarCompiled(grammar, self._json_safe if data[:1] == b"j" else None)

    def new_grammar(self, compiled: XGrammarCompiled) -> XGrammarGrammar:
        matcher = self._xgr.GrammarMatcher(compiled.grammar,
                                           override_stop_tokens=list(self.eos_token_ids))
        return XGrammarGrammar(matcher, compiled)


_STATE_KEYS: dict[tuple[str, bool], StateKey] = {}  # (debug text, completed) -> key


def _state_key(text: str, done: bool) -> StateKey:
    head, _, states = text.partition("Last step:")
    steps = _STEPS.search(head)
    now = int(steps.group(1)) if steps else 0
    full = _START.sub(lambda m: str(now - int(m.group(1))), states)
    return StateKey((done, _START.sub("", states)), (done, full))


def _and_rows(words: Any, rows: Sequence[int], filt: Any) -> None:
    """``words[r] &= filt`` for the sorted ``rows``, in place over runs of adjacent rows.
    NOTE: numpy, not torch (see base.allocate_bitmask); a fancy-indexed ``&=`` copies the rows
    out and back. Many rows are split over the accept pool (numpy releases the GIL): one
    thread took ~1 ms for 256 rows on the H100 host, on the path to the sampling launch."""
    runs, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1:
            runs.append((rows[start], rows[i - 1] + 1))
            start = i
    step = max(_MIN_ACCEPT_CHUNK, -(-len(rows) // _fill_threads()))
    spans = [(lo, min(lo + step, end)) for first, end in runs for lo in range(first, end, step)]

    def run(span: tuple[int, int]) -> None:
        np.bitwise_and(words[span[0]:span[1]], filt, out=words[span[0]:span[1]])
    if len(spans) == 1:
        run(spans[0])
    else:
        list(_accept_pool().map(run, spans))


def _accept_native(grammars: Sequence[Grammar], token_ids: Sequence[int]) -> list[bool]:
    """One native batch accept on the calling thread."""
    import xgrammar as xgr

    oks = xgr.BatchGrammarMatcher.batch_accept_token([g._matcher for g in grammars],
                                                     [int(t) for t in token_ids])
    for g, ok in zip(grammars, oks):
        g._accepted += ok
    return oks


def _spans_by_weight(weights: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """``parts`` (or fewer) consecutive index spans of about equal total weight."""
    share, spans, start, acc = sum(weights) / parts, [], 0, 0
    for i, w in enumerate(weights):
        acc += w
        if acc >= share * (len(spans) + 1) and len(spans) < parts - 1:
            spans.append((start, i + 1))
            start = i + 1
    if start < len(weights):
        spans.append((start, len(weights)))
    return spans


_FILLERS = threading.local()


def _batch_filler() -> Any:
    """This thread's xgrammar.BatchGrammarMatcher (fills many rows with its own threads). One
    per thread: the prefetch job and the scheduler thread fill rows of one step at once."""
    filler = getattr(_FILLERS, "filler", None)
    if filler is None:
        import xgrammar as xgr

        filler = _FILLERS.filler = xgr.BatchGrammarMatcher(_fill_threads())
    return filler


_MIN_ACCEPT_CHUNK = 16  # rows per accept task: below this a thread hop costs more than it saves
# NOTE: fewer rows are accepted in one native call on the calling thread: jump-forward accepts
# its forced tokens one position at a time for ~30 requests (256 decoding, H100 host), and
# the pool's round trips (~150 us of waiting per task) cost more than the accepts themselves
_MIN_THREADED_ACCEPT = 64
_MIN_THREADED_TOKENS = 32  # tokens per task of a multi-token accept (accept_tokens_batch)
_ACCEPT_POOL: Any = None


def _accept_pool() -> Any:
    global _ACCEPT_POOL
    if _ACCEPT_POOL is None:
        import concurrent.futures as cf

        _ACCEPT_POOL = cf.ThreadPoolExecutor(_fill_threads(), thread_name_prefix="sgdsl-accept")
    return _ACCEPT_POOL


def _fill_threads() -> int:
    """Threads of the batch filler: half the cores (the scheduler, tokenizer and compile
    workers keep the rest), at least 1; SGDSL_GRAMMAR_FILL_THREADS overrides."""
    import os

    env = os.environ.get("SGDSL_GRAMMAR_FILL_THREADS")
    return max(1, int(env) if env else (os.cpu_count() or 2) // 2)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[-1][:500] if "\n" in text else text[:500]


def _json_safe_row(tokenizer: Any, vocab_size: int) -> torch.Tensor:
    """One bitmask row allowing every token except those containing a byte below 0x20."""
    from .base import allocate_bitmask
    from .vocab import token_bytes

    row = allocate_bitmask(1, vocab_size)[0]
    for i, data in enumerate(token_bytes(tokenizer, vocab_size)):
        if data is not None and any(b < 0x20 for b in data):
            row[i // 32] &= ~(1 << (i % 32)) if i % 32 != 31 else 0x7FFFFFFF
    return row

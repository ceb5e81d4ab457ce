"""``XGrammarGrammar``: one request's xgrammar matcher (the per-step half of the xgrammar
backend, ``xgrammar.py``, which compiles), with the batch calls that run in xgrammar's native
thread pool (``xgrammar_threads.py``) and the UTF-8 state xgrammar does not keep
(``utf8_tokens.py``: a token that would make the output invalid UTF-8 is refused).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from ..base import Grammar, StateKey, accept_positions
from ..guards.token_rows import undo_if_empty
from ..guards.utf8_tokens import BOUNDARY, REJECT
from .xgrammar_threads import (MIN_ACCEPT_CHUNK, MIN_THREADED_ACCEPT, MIN_THREADED_TOKENS,
                               accept_pool, and_rows, batch_accept, batch_filler,
                               fill_threads, spans_by_weight)

if TYPE_CHECKING:
    from .xgrammar import XGrammarCompiled

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



_STATE_KEYS: dict[tuple[str, bool], StateKey] = {}  # (debug text, completed) -> key


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


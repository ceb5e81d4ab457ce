"""Shortest completion: a short token path from where a matcher stands to a complete match (a
state in which a stop token is accepted).

Neither xgrammar nor outlines-core exposes the distance to acceptance, so it is searched: a
uniform-cost search over matcher states, moving by accept/rollback, the cost of a path being
its length in characters. The moves out of a state, in order:

1. the jump-forward string, when the grammar forces text (then it is the only move);
2. else the single-character tokens the state's bitmask allows, in an order that finishes JSON
   and everyday regexes fast: closing quote/brace/bracket/paren, separators, ``0``-``9``,
   ``a``-``z``, ``A``-``Z``, the rest of printable ASCII; where a quote may come but no
   letter or digit (just after ``{`` or ``[``), the closers before the quote;
3. where none of those is allowed (non-ASCII text), the shortest allowed token.

(``moves.py`` generates these moves; this module searches over them.)

States are merged by ``Grammar.state_key()`` (all the letters inside a JSON string lead to one
state), which keeps the search to a few expansions per token of the answer. The work is
bounded (``max_expansions``); the answer is the cheapest complete path found, and since every
move was accepted by the matcher itself, any answer is a valid continuation. Where that bound
finds nothing (deep nesting: every level is a few moves), ``search_deep`` tries again with a
bound scaled by the caller's effort and capped in time: the rare path, so the common one stays
cheap.

A backend that knows its distances to acceptance (outlines: a DFA, tabled at compile time by
``outlines_completion.py``) gives the completion through ``Grammar.known_completion``; it is
replayed and taken without searching, the search running only where the table has no answer.
"""
from __future__ import annotations

import heapq
import itertools
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterator, Sequence


from ..base import Grammar
from .moves import Moves
from .search_walk import Bound, Walker, completes

_MAX_DEPTH = 256  # moves on one depth-first path
_DEEP_FACTOR = 16  # search_deep: at most this many times max_expansions (and 4x the depth)
_ROOT = "start"  # the cache's state key of a matcher that accepted nothing


@dataclass(frozen=True)
class Completion:
    """``token_ids`` take the matcher to a complete state; ``text`` is what they spell."""

    token_ids: tuple[int, ...]
    text: str


class CompletionSearch(Moves):
    """Built once per engine (tokenizer facts); ``search`` runs per request state."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Sequence[int], *,
                 max_expansions: int = 256, max_tries: int = 64,
                 cache_size: int = 4096, deep_seconds: float = 0.05) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_ids = frozenset(stop_ids)
        self.max_expansions = max_expansions
        self.deep_seconds = deep_seconds  # wall-clock cap of one search_deep
        self.max_tries = max_tries  # single-character moves tried per state
        self._init_moves(tokenizer, vocab_size)
        # (id of the compiled grammar, state key) -> (weak reference to that grammar, answer),
        # least recently used first; the reference tells a reused id from the grammar's own.
        self._cache: OrderedDict[Hashable, tuple[Any, Completion]] = OrderedDict()
        # NOTE: the scheduler thread's only: other searchers use ``fresh``
        self.cache_size = cache_size
        self.searches = 0
        self.deep_searches = 0
        self.cache_hits = 0
        self.known = 0  # answers read from the backend's table (``_known``)

    def search(self, grammar: Grammar, check: bool = True) -> Completion | None:
        """A short completion from ``grammar``'s state (empty if it is complete); None if the
        bounded search finds none. ``grammar`` is left as it was.

        Answers are shared between requests of one compiled grammar whose states have the
        same ``state_key().full`` (every request starts in the same state; many pass through
        the same ones). An inexact key may join states with different futures, so a shared
        answer is replayed on the matcher first (``check``), and then always completes this
        state, at worst a little longer than the shortest. ``check=False`` skips the replay
        (a few hundred microseconds) where the answer is only an estimate of the length
        (completion.py replays it before forcing it); the start state needs no replay."""
        if grammar.is_terminated():
            return None
        hit, keys = self.cached(grammar, check)
        if hit is not None:
            return hit
        found = self._search(grammar)
        self.store(grammar, keys, found)
        return found

    def cached(self, grammar: Grammar, check: bool = True,
               ) -> tuple[Completion | None, tuple[Hashable, ...]]:
        """``search``'s answer if the cache has it for ``grammar``'s state (else None), and
        the state's cache keys (for ``store``)."""
        keys = self._cache_keys(grammar)
        for i, key in enumerate(keys):
            hit = self._lookup(key)
            # NOTE: a key is replayed unless it is exact (the start) or only an estimate is
            # wanted; the second key (the newest parse step only) joins states with different
            # futures, so its answer is always replayed: one that completes this state is a
            # valid completion, at worst longer than the shortest, which makes an estimate
            # that forces early, never late.
            if hit is not None and (key[1] is _ROOT or (not check and i == 0)
                                    or completes(grammar, hit.token_ids)):
                self._cache.move_to_end(key)
                self.cache_hits += 1
                return hit, keys
        return None, keys

    def store(self, grammar: Grammar, keys: tuple[Hashable, ...],
              found: Completion | None) -> None:
        """Share ``found`` (searched from ``grammar``'s state, whose keys are ``keys``)."""
        if found is None:
            return
        for key in keys:
            self._cache[key] = (weakref.ref(grammar.cache_scope()), found)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def fresh(self, grammar: Grammar) -> Completion | None:
        """A bounded search from ``grammar``'s state, cache untouched: safe on another thread
        than the cache's (estimate.py), on a grammar no one else uses meanwhile."""
        return None if grammar.is_terminated() else self._search(grammar)

    def _lookup(self, key: Hashable) -> Completion | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        owner, hit = entry
        if owner() is None or id(owner()) != key[0]:  # the id was reused by another grammar
            del self._cache[key]
            return None
        return hit

    def _cache_keys(self, grammar: Grammar) -> tuple[Hashable, ...]:
        """(exact-or-full key, local key) of ``grammar``'s state in the answer cache; none
        when the backend has no state keys or its compiled grammar cannot be referenced."""
        scope = grammar.cache_scope()
        if scope is None or not hasattr(type(scope), "__weakref__"):
            return ()
        if grammar.num_accepted == 0:  # exact: every matcher of a grammar starts here
            return ((id(scope), _ROOT),)
        state = grammar.state_key()
        return () if state is None else ((id(scope), state.full), (id(scope), "local", state.local))

    def search_deep(self, grammar: Grammar, effort: int) -> Completion | None:
        """After ``search`` found nothing: a search with ``max_expansions + 8 * effort``
        expansions (at most ``_DEEP_FACTOR`` times the usual), a deeper path allowed, stopped
        after ``deep_seconds`` whatever it reached (an expansion costs 0.01-20 ms depending on
        the grammar). ``effort`` is the caller's measure of how far the answer may be (the
        output's length: nesting grows with it). Not cached: it is the rare path."""
        if grammar.is_terminated():
            return None
        self.deep_searches += 1
        expansions = min(self.max_expansions * _DEEP_FACTOR, self.max_expansions + 8 * effort)
        return self._search(grammar, Bound(expansions, _MAX_DEPTH * 4,
                                            time.perf_counter() + self.deep_seconds))

    def _search(self, grammar: Grammar, bound: Bound | None = None) -> Completion | None:
        self.searches += 1
        known = self._known(grammar)
        if known is not None:
            return known
        walker = Walker(grammar)
        bound = bound or Bound(self.max_expansions, _MAX_DEPTH, None)
        try:
            if grammar.exact_state_key:
                path = self._uniform_cost(grammar, walker, bound)
            else:
                path = self._depth_first(grammar, walker, bound)
        finally:
            walker.goto(())
        if path is None:
            return None
        return Completion(path, self.tokenizer.decode(list(path)))

    def _known(self, grammar: Grammar) -> Completion | None:
        """The completion the backend's table gives (``Grammar.known_completion``), if the
        matcher accepts it and completes: in the tokens its text encodes to where those
        are accepted (fewer to replay), else in the table's own."""
        ids = grammar.known_completion()
        if ids is None:
            return None
        text = self.tokenizer.decode(list(ids))
        encoded = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        for path in (encoded, tuple(ids)):
            if completes(grammar, path):
                self.known += 1
                return Completion(path, text)
        return None

    def _uniform_cost(self, grammar: Grammar, walker: Walker,
                      bound: Bound) -> tuple[int, ...] | None:
        """Exact keys: the cheapest path in tokens (over the moves above), each state once."""
        order = itertools.count()
        heap: list[tuple[int, int, tuple[int, ...]]] = [(0, next(order), ())]
        root = grammar.state_key()
        best: dict[Hashable, int] = {} if root is None else {root.merge_key(): 0}
        for _ in bound.steps():
            if not heap:
                return None
            cost, _, path = heapq.heappop(heap)
            if not walker.goto(path):
                continue
            if grammar.is_completed():
                return path
            for ids, step, key in self._moves(grammar, set()):
                if key is not None:
                    merged = key.merge_key()
                    if best.get(merged, cost + step + 1) <= cost + step:
                        continue
                    best[merged] = cost + step
                heapq.heappush(heap, (cost + step, next(order), path + ids))
        return None

    def _depth_first(self, grammar: Grammar, walker: Walker,
                     bound: Bound) -> tuple[int, ...] | None:
        """Inexact keys (xgrammar): a depth-first walk taking moves in priority order, moves
        back into a state already on the path (another digit, another letter: a loop) last.
        Globally merging states would be unsound here (an inexact key can hide a repetition
        count), and breadth-first without merging grows exponentially, so the first complete
        path is the answer."""
        stack: list[tuple[tuple[int, ...], Iterator, Hashable]] = []
        node: tuple[int, ...] = ()
        on_path: list[Hashable] = []
        for _ in bound.steps():
            if grammar.is_completed():
                return node
            if len(stack) < bound.depth:
                here = grammar.state_key()
                local = None if here is None else here.local
                on_path.append(local)
                stack.append((node, iter(self._moves(grammar, set(on_path), local)), local))
            while stack:
                node, moves, _ = stack[-1]
                walker.goto(node)
                move = next(moves, None)
                if move is not None and walker.goto(node + move[0]):
                    node = walker.path
                    break
                if move is None:
                    stack.pop()
                    on_path.pop()
            else:
                return None
        return None

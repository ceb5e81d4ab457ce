"""How far a ``pattern``'s match is from its end: the automaton the length guard uses so that a
string whose bounds beside a pattern the runtime counts (``schema/lengths.py``) is not led
into a dead end (a prefix the pattern can only finish past ``maxLength``: ``a-`` with one
character of room left, under ``^[a-z]+(-[a-z]+)*$``).

The pattern is parsed as length folding parses it (``schema/patterns.py``) and built into an
NFA over code points (Thompson's construction, bounded repeats copied out), each state with
its distance to acceptance (fewest characters still to write). ``string_chars.LengthTokens``
asks, for the tokens that would land within ``max_dist`` characters of the bound, whether the
pattern can still end in the room left. The grammar enforces the pattern itself; this only
steers, so where Python's reading of a pattern differs from the backend's the worst outcome
is a dead end let through (the output check then fails the request), never a wrong output.
"""
from __future__ import annotations

import functools
import re
from collections import deque
from typing import Callable

from ..schema.patterns import Node, Unfoldable, parse_pattern

MAX_STATES = 4096  # NFA states (bounded repeats are copied out); beyond: no automaton
_INF = 1 << 30


class PatternReach:
    """The NFA of one pattern (whole-string match) with distances to acceptance."""

    def __init__(self, pattern: str) -> None:
        self._eps: list[list[int]] = []
        self._chars: list[list[tuple[Callable[[str], bool], int]]] = []
        start, self._accept = self._build(parse_pattern(pattern))
        self.start = self._closure({start})
        self._dist = self._distances()
        reach = self._reachable(start)
        self.max_dist = max((self._dist[s] for s in reach if self._dist[s] < _INF), default=0)

    def step(self, states: frozenset, text: str) -> frozenset:
        """The states after reading ``text`` (empty: the pattern cannot go on)."""
        for ch in text:
            if not states:
                break
            states = self._closure({t for s in states for ok, t in self._chars[s] if ok(ch)})
        return states

    def dist(self, states: frozenset) -> int:
        """Fewest characters from ``states`` to a complete match (a large number if none)."""
        return min((self._dist[s] for s in states), default=_INF)

    # -- construction ---------------------------------------------------------------------------
    def _new(self) -> int:
        if len(self._eps) >= MAX_STATES:
            raise Unfoldable(f"over {MAX_STATES} automaton states")
        self._eps.append([])
        self._chars.append([])
        return len(self._eps) - 1

    def _build(self, node: Node) -> tuple[int, int]:
        if node.kind == "atom":
            s, e = self._new(), self._new()
            self._chars[s].append((_predicate(node.text), e))
            return s, e
        if node.kind == "group":
            return self._build(node.children[0])
        s = cur = self._new()
        if node.kind == "alt":
            e = self._new()
            for child in node.children:
                cs, ce = self._build(child)
                self._eps[s].append(cs)
                self._eps[ce].append(e)
            return s, e
        if node.kind == "seq":
            for child in node.children:
                cs, ce = self._build(child)
                self._eps[cur].append(cs)
                cur = ce
            return s, cur
        return self._repeat(node, s)

    def _repeat(self, node: Node, s: int) -> tuple[int, int]:
        cur, child = s, node.children[0]
        for _ in range(node.lo):
            cs, ce = self._build(child)
            self._eps[cur].append(cs)
            cur = ce
        if node.hi is None:  # a loop, left at any turn
            cs, ce = self._build(child)
            self._eps[cur].append(cs)
            self._eps[ce].append(cur)
            return s, cur
        for _ in range(node.hi - node.lo):
            cs, ce = self._build(child)
            out = self._new()
            self._eps[cur] += [cs, out]
            self._eps[ce].append(out)
            cur = out
        return s, cur

    def _closure(self, states: set[int]) -> frozenset:
        todo, seen = list(states), set(states)
        while todo:
            for t in self._eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    def _distances(self) -> list[int]:
        """0-1 BFS from the accepting state over reversed edges (a character costs 1)."""
        back: list[list[tuple[int, int]]] = [[] for _ in self._eps]
        for s, targets in enumerate(self._eps):
            for t in targets:
                back[t].append((s, 0))
        for s, edges in enumerate(self._chars):
            for _, t in edges:
                back[t].append((s, 1))
        dist = [_INF] * len(self._eps)
        dist[self._accept] = 0
        todo = deque([self._accept])
        while todo:
            t = todo.popleft()
            for s, w in back[t]:
                if dist[t] + w < dist[s]:
                    dist[s] = dist[t] + w
                    todo.appendleft(s) if w == 0 else todo.append(s)
        return dist

    def _reachable(self, start: int) -> set[int]:
        seen, todo = {start}, [start]
        while todo:
            s = todo.pop()
            for t in self._eps[s] + [t for _, t in self._chars[s]]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen


def _predicate(atom: str) -> Callable[[str], bool]:
    """Whether one code point matches ``atom`` (a literal, class, escape or ``.``)."""
    rx = re.compile(atom)
    return functools.lru_cache(maxsize=512)(lambda ch: rx.fullmatch(ch) is not None)


@functools.lru_cache(maxsize=64)
def pattern_reach(pattern: str) -> PatternReach | None:
    """The automaton of ``pattern`` (shared per pattern), or None where it cannot be built."""
    try:
        return PatternReach(pattern)
    except (Unfoldable, re.error, RecursionError):
        return None

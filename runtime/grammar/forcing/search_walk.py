"""Small pieces of the shortest-completion search (``shortest.py``): ``Walker`` moves one
matcher between search paths by rolling back to their common prefix, ``Bound`` is one
search's limits (expansions, path depth, a wall-clock deadline for the rare deep search), and
two probes that try tokens on a matcher and roll them back (``completes``, ``try_key``)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Hashable, Iterator, Sequence

from ..base import Grammar


@dataclass(frozen=True)
class Bound:
    """One search's limits: expansions, moves on a depth-first path, a wall-clock deadline."""

    expansions: int
    depth: int
    deadline: float | None

    def steps(self) -> Iterator[int]:
        for i in range(self.expansions):
            if self.deadline is not None and time.perf_counter() > self.deadline:
                return
            yield i


class Walker:
    """Moves one matcher between search paths by rolling back to the common prefix."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.path: tuple[int, ...] = ()

    def goto(self, path: tuple[int, ...]) -> bool:
        common = 0
        for a, b in zip(self.path, path):
            if a != b:
                break
            common += 1
        self.grammar.rollback(len(self.path) - common)
        self.path = self.path[:common]
        if self.grammar.accept_tokens(path[common:]):
            self.path = path
            return True
        return False


NO_KEY = object()  # accepted, but the backend gives no state key


def try_key(grammar: Grammar, ids: tuple[int, ...]) -> Hashable | None:
    """Accept ``ids``, read the state key, roll back: the key (``NO_KEY`` if the backend has
    none), or None if the grammar rejects them."""
    if not ids or not grammar.accept_tokens(ids):
        return None
    key = grammar.state_key()
    grammar.rollback(len(ids))
    return NO_KEY if key is None else key


def completes(grammar: Grammar, ids: Sequence[int]) -> bool:
    """True if ``ids`` take ``grammar`` to a complete state (``grammar`` left as it was)."""
    if not grammar.accept_tokens(ids):
        return False
    done = grammar.is_completed()
    grammar.rollback(len(ids))
    return done

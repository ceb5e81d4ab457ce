"""Two small pieces of the shortest-completion search (``shortest.py``): ``Walker`` moves one
matcher between search paths by rolling back to their common prefix, and ``Bound`` is one
search's limits (expansions, path depth, a wall-clock deadline for the rare deep search)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

from .base import Grammar


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

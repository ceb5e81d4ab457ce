"""TreeCandidates: the nodes an EAGLE head drafted for one request, and the tree it proposes.

As in SGLang's EAGLE: each draft step expands every node of the frontier (at most ``topk``
nodes) into its ``topk`` most likely children, every child becomes a candidate scored by its
path's log-probability (parent's score + its own log-prob), and the ``topk`` best children form
the next frontier. The proposed tree is the ``n`` best candidates: a child never scores above
its parent, and ties go to the shallower node, so the best ``n`` always include their
ancestors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import ROOT, DraftTree


@dataclass
class TreeCandidates:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)

    def add(self, token: int, parent: int, score: float) -> int:
        """A candidate under ``parent`` (a candidate index, or ROOT); its index."""
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.scores.append(float(score))
        self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
        return len(self.tokens) - 1

    def expand(self, node: int, tokens: list[int], logprobs: list[float]) -> list[int]:
        """Children of ``node`` (ROOT: the first level), scored along their path."""
        base = 0.0 if node == ROOT else self.scores[node]
        return [self.add(t, node, base + lp) for t, lp in zip(tokens, logprobs)]

    def best(self, nodes: list[int], k: int) -> list[int]:
        """The ``k`` best of ``nodes`` (the next frontier)."""
        return sorted(nodes, key=self._rank)[:k]

    def tree(self, n: int) -> DraftTree:
        """The ``n`` best candidates as a tree (candidates were added parents first, so
        index order is a topological order)."""
        keep = sorted(sorted(range(len(self.tokens)), key=self._rank)[:n])
        full = DraftTree(tuple(self.tokens), tuple(self.parents))
        return full.subtree(keep)

    def _rank(self, i: int) -> tuple[float, int, int]:
        return (-self.scores[i], self.depths[i], i)

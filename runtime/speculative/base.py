"""The shapes every drafter and the verifier share: a draft token tree and the drafter interface.

A ``DraftTree`` holds the draft tokens proposed after a request's last verified token (the last
token of ``req.all_ids``, which has no KV yet while decoding). Node ``i`` is token
``tokens[i]`` whose parent is node ``parents[i]``; ``-1`` is the last verified token. Nodes are
in topological order (``parents[i] < i``), so a chain is ``parents == (-1, 0, 1, ...)``.

A ``Drafter`` proposes one tree per request. It keeps its own state (draft KV, n-gram index)
and syncs it from ``req.all_ids`` on each call: it truncates what it holds to the common prefix
with ``all_ids`` and extends, so the verifier never has to tell it what was accepted.
Drafts are point masses (greedy drafting); the verifier's rejection sampling relies on that.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

ROOT = -1  # parent index of a node hanging off the request's last verified token


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens and their parents (see module docstring). Empty: no speculation."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"DraftTree: {len(self.tokens)} tokens but "
                             f"{len(self.parents)} parents")
        for i, p in enumerate(self.parents):
            if not ROOT <= p < i:
                raise ValueError(f"DraftTree: node {i} has parent {p}; parents must be "
                                 "-1 or an earlier node")

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "DraftTree":
        """A linear draft: each token follows the previous one."""
        return cls(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node: 1 for children of the root."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p == ROOT else out[p] + 1)
        return tuple(out)

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path (0 for an empty tree)."""
        return max(self.depths, default=0)

    def children(self, node: int) -> list[int]:
        """Nodes whose parent is ``node`` (``ROOT`` for the first level), in order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive)."""
        out: list[int] = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def ancestor_mask(self) -> list[list[bool]]:
        """``mask[i][j]``: node i may attend to node j (j is i or one of its ancestors)."""
        n = len(self.tokens)
        mask = [[False] * n for _ in range(n)]
        for i in range(n):
            for j in self.path(i):
                mask[i][j] = True
        return mask

    def prefix(self, keep: int) -> "DraftTree":
        """The first ``keep`` nodes (still a tree: parents come before children)."""
        return DraftTree(self.tokens[:keep], self.parents[:keep])

    def subtree(self, keep: Sequence[int]) -> "DraftTree":
        """Only the nodes in ``keep`` (ancestor-closed), renumbered in order."""
        order = sorted(set(keep))
        new = {old: i for i, old in enumerate(order)}
        new[ROOT] = ROOT
        for i in order:
            if self.parents[i] not in new:
                raise ValueError(f"DraftTree.subtree: node {i} kept without its parent")
        return DraftTree(tuple(self.tokens[i] for i in order),
                         tuple(new[self.parents[i]] for i in order))


EMPTY_TREE = DraftTree()


class Drafter(ABC):
    """Proposes draft trees for a batch of decoding requests.

    Built by ``registry.build_drafter(config, runner)`` as ``cls(config, runner)``: ``config`` is
    the ``EngineConfig``, ``runner`` the target's ``ModelRunner`` (device, dtype, vocab).
    """

    # EAGLE-style drafters read the target's hidden states of the verified tokens.
    needs_hidden_states: bool = False

    @abstractmethod
    def propose(self, reqs: Sequence[Any], max_tokens: int,
                hidden: Any = None) -> list[DraftTree]:
        """One tree per request in ``reqs`` (same order), at most ``max_tokens`` nodes each.
        An empty tree means no speculation for that request this step."""

    def predict(self, reqs: Sequence[Any], max_tokens: int) -> list[DraftTree] | None:
        """What ``propose`` would draft from each request's ids as they are now, cheaply and
        without changing what ``propose`` returns later (prediction.py: whether to read the
        step in flight for a speculative step). None: no cheap guess (a draft model), taken
        to mean a draft whenever the request may draft."""
        return None

    def prefetch(self, reqs: Sequence[Any], trees: Sequence[DraftTree]) -> None:
        """Called while the device verifies ``trees`` (before their result is read): work for
        the next ``propose`` that can be done ahead, on a guess of the accepted tokens, as long
        as ``propose`` returns what it would have without it (NGRAM: its next lookups)."""

    def guess_next(self, rid: str) -> tuple[tuple[int, ...], DraftTree] | None:
        """After ``prefetch``: the tokens request ``rid`` is guessed to append this step (its
        accepted draft tokens and the bonus token) and what ``propose`` would draft then, for a
        verify batch built ahead (prebuild.py). None: no guess."""
        return None

    def proposal_cost(self) -> float | None:
        """A lower bound, known before anything is measured, on what one ``propose`` costs in
        target decode steps at the same batch size (cost.py: a drafter whose proposals cost so
        much that even every draft accepted cannot beat plain decoding is probed rarely).
        None: no estimate."""
        return None

    def release(self, rid: str) -> None:
        """Forget request ``rid`` (finished, aborted or retracted); free what it held."""

    def check_idle(self) -> list[str]:
        """Problems with the drafter's own resources when no request runs (empty: fine)."""
        return []

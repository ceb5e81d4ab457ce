"""Radix prefix cache: a radix tree over token ids whose nodes own KV slots in a ``TokenKVPool``.

Ownership of KV slots (who frees what):

- A slot that is *in the tree* belongs to the tree. Only eviction (``evict``) or ``reset`` frees it.
- A slot a request allocated from the pool belongs to that request until it hands it to the tree
  with ``insert``. ``insert(ids, slots)`` returns ``n``, the number of leading tokens that were
  already in the tree *before* the call; the tree keeps its own slots for ``ids[:n]`` and adopts
  ``slots[n:]``. So for positions ``[prefix_len, n)`` the caller's slots are duplicates, where
  ``prefix_len`` is the length of the prefix the caller matched (and whose slots it got *from* the
  tree): the caller must free ``slots[prefix_len:n]``. ``cache_finished_req`` and
  ``cache_unfinished_req`` do exactly this for the scheduler.
- A request keeps the node of its matched prefix locked (``lock``) while it runs, so the slots it
  read from the tree cannot be evicted under it. Locks count along the whole path to the root.

Idle invariant (``check_integrity(idle=True)``): pool free + evictable == pool size, nothing locked.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .pool import TokenKVPool

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclass(eq=False)
class TreeNode:
    """One edge of the tree: ``key`` token ids (from the parent) with their KV ``value`` slots."""

    key: list[int]
    value: torch.Tensor
    parent: "TreeNode | None" = None
    children: dict[int, "TreeNode"] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    # Tokens from the root to the end of this node; stable across splits of ancestors.
    prefix_len: int = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class MatchResult:
    """``slots``: KV slots of the matched prefix (int64, CPU); ``node``: where the match ends
    (lock it while the slots are in use)."""

    slots: torch.Tensor
    node: TreeNode

    @property
    def length(self) -> int:
        return int(self.slots.numel())


class RadixCache:
    """Longest-prefix KV reuse with LRU eviction of unlocked leaves.

    ``disable=True`` gives a cache that matches nothing and frees a finished request's slots.
    Access times are a logical clock (a counter), so LRU order is exact and deterministic.
    """

    def __init__(self, token_pool: TokenKVPool, disable: bool = False) -> None:
        self.pool = token_pool
        self.disable = disable
        self._clock = itertools.count(1)
        self.reset_stats()
        self._new_root()

    # ---- lifecycle -------------------------------------------------------------------------
    def _new_root(self) -> None:
        self.root = TreeNode(key=[], value=_EMPTY)
        self.root.lock_ref = 1  # NOTE: the root is never evicted; its lock is not a request's.
        self._evictable = 0
        self._protected = 0

    def reset_stats(self) -> None:
        self.hit_tokens = 0
        self.query_tokens = 0

    def reset(self) -> bool:
        """Flush: free every cached slot back to the pool. Refuses (False) while anything is locked."""
        if self._protected:
            return False
        for node in self._nodes():
            if node is not self.root:
                self.pool.free(node.value)
        self._new_root()
        self.reset_stats()
        return True

    # ---- matching --------------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> MatchResult:
        """Longest cached prefix of ``token_ids``. Splits a node when the match ends inside it,
        refreshes access times along the path and counts hit/query tokens.

        NOTE: a request must still compute at least one token to get logits; the scheduler passes
        ``prompt[:-1]`` (or shorter, for prompt logprobs) when it wants that guarantee."""
        result = self._match(token_ids if type(token_ids) is list else list(token_ids))
        self.query_tokens += len(token_ids)
        self.hit_tokens += result.length
        return result

    def rematch(self, node: TreeNode, token_ids: Sequence[int], length: int) -> int | None:
        """How much of ``token_ids[:length]`` ``match_prefix`` would match, given that its
        last match of that key ended at ``node``, in O(depth) instead of O(length): None
        unless a match would end there again (``node`` is still in the tree and the key does
        not go on below it); then it refreshes the access times and counts the tokens as
        ``match_prefix`` does. ``path_slots(node)`` gives the match's slots.

        NOTE: LPM matches every waiting request on every scheduling pass: at 128 waiting
        2k-token prompts the walks cost ~5 ms of host time a step. A path's tokens never change
        (a split keeps their concatenation, eviction removes leaves), so a match stays valid
        while its last node is attached and gained no child continuing the key."""
        n = node.prefix_len
        if self.disable or n > length or (n < length and token_ids[n] in node.children):
            return None
        path, child = [], node
        while child is not self.root:
            parent = child.parent
            if parent is None or parent.children.get(child.key[0]) is not child:
                return None  # evicted (or flushed: the chain ends at an old root)
            path.append(child)
            child = parent
        now = next(self._clock)
        self.root.last_access = now
        for child in path:
            child.last_access = now
        self.query_tokens += length
        self.hit_tokens += n
        return n

    def path_slots(self, node: TreeNode) -> torch.Tensor:
        """The KV slots of the tokens from the root to the end of ``node`` (as a match's)."""
        parts = []
        while node is not self.root and node is not None:
            parts.append(node.value)
            node = node.parent
        return torch.cat(parts[::-1]) if parts else _EMPTY

    def _match(self, key: list[int]) -> MatchResult:
        if self.disable or not key:
            return MatchResult(_EMPTY, self.root)
        now = next(self._clock)
        node, pos, parts = self.root, 0, []
        node.last_access = now
        while pos < len(key) and key[pos] in node.children:
            child = node.children[key[pos]]
            n = _common_len(child.key, key, pos)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            child.last_access = now
            parts.append(child.value)
            node, pos = child, pos + n
            if partial:
                break
        slots = torch.cat(parts) if parts else _EMPTY
        return MatchResult(slots, node)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child``'s edge after ``n`` tokens; return the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = TreeNode(key=child.key[:n], value=child.value[:n], parent=parent,
                         lock_ref=child.lock_ref, last_access=child.last_access,
                         prefix_len=parent.prefix_len + n)
        # Every lock through ``child`` also passes through ``upper``: copying lock_ref keeps the
        # evictable/protected counters unchanged.
        parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[child.key[0]] = child
        return upper

    # ---- insertion -------------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int], slots: torch.Tensor) -> int:
        """Cache ``token_ids`` with their KV ``slots``; return how many leading tokens were
        already cached (the caller frees its duplicates in that range; see the module doc)."""
        key = list(token_ids)
        assert len(key) == int(slots.numel()), "insert: one slot per token"
        if self.disable or not key:
            return 0
        slots = slots.to("cpu", torch.int64)
        match = self._match(key)
        node, pos = match.node, match.length
        if pos < len(key):
            leaf = TreeNode(key=key[pos:], value=slots[pos:].clone(), parent=node,
                            last_access=node.last_access, prefix_len=node.prefix_len + len(key) - pos)
            node.children[key[pos]] = leaf
            self._evictable += len(leaf.key)
        return pos

    # ---- locking ---------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (ref counted)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock(node)``."""
        while node is not self.root:
            assert node.lock_ref > 0, "unlock of an unlocked radix node"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node = node.parent  # type: ignore[assignment]

    # ---- eviction --------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots (if that many are evictable) from unlocked leaves,
        least recently used first; parents that become unlocked leaves join the queue.
        Returns the number of slots freed."""
        if num_tokens <= 0 or self._evictable == 0:
            return 0
        tie = itertools.count()
        heap = [(n.last_access, next(tie), n) for n in self._nodes()
                if n.is_leaf and n.lock_ref == 0 and n is not self.root]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            self.pool.free(node.value)
            freed += len(node.key)
            self._evictable -= len(node.key)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[0]]
            if parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, next(tie), parent))
        return freed

    # ---- scheduler conveniences ------------------------------------------------------------
    def cache_finished_req(self, token_ids: Sequence[int], slots: torch.Tensor,
                           node: TreeNode) -> None:
        """A request finished: cache its tokens, free its duplicate slots, release its lock.

        ``token_ids``/``slots``: every token whose KV was computed (so not the last sampled token)
        and the request's slots for them; ``slots[:node.prefix_len]`` came from the tree."""
        if self.disable:
            self.pool.free(slots[node.prefix_len:])
            if node is not self.root:
                self.unlock(node)
            return
        new_len = self.insert(token_ids, slots)
        self.pool.free(slots[node.prefix_len:new_len])
        self.unlock(node)

    def cache_unfinished_req(self, token_ids: Sequence[int], slots: torch.Tensor,
                             node: TreeNode) -> tuple[torch.Tensor, TreeNode]:
        """Cache a running request's computed tokens (chunked prefill, long decodes) and move its
        lock to the new deepest node. Returns ``(new_slots, new_node)``: the caller must write
        ``new_slots`` into its ``req_to_token`` row (duplicates were replaced by the tree's slots)
        and keep ``new_node`` as its locked node."""
        if self.disable:
            return slots, node
        new_len = self.insert(token_ids, slots)
        self.pool.free(slots[node.prefix_len:new_len])
        match = self._match(list(token_ids))
        assert match.length == len(token_ids)
        self.lock(match.node)
        self.unlock(node)
        return match.slots, match.node

    # ---- sizes, stats, integrity -----------------------------------------------------------
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        """Slots held by the tree (evictable + protected)."""
        return self._evictable + self._protected

    def stats(self) -> dict[str, float | int]:
        q = self.query_tokens
        return {"cache_hit_tokens": self.hit_tokens, "cache_query_tokens": q,
                "cache_hit_rate": self.hit_tokens / q if q else 0.0,
                "evictable_size": self._evictable, "protected_size": self._protected,
                "total_size": self.total_size(), "num_nodes": sum(1 for _ in self._nodes()) - 1}

    def _nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self, idle: bool = False) -> None:
        """Assert tree structure, size counters and slot accounting against the pool.
        ``idle=True`` (no running request) also requires nothing locked and
        pool free + evictable == pool size."""
        evictable = protected = 0
        seen: list[torch.Tensor] = []
        for node in self._nodes():
            child_locks = 0
            for first, child in node.children.items():
                assert child.key and child.key[0] == first, "child keyed by the wrong token"
                assert child.parent is node, "broken parent pointer"
                assert len(child.key) == int(child.value.numel()), "key/value length mismatch"
                assert child.prefix_len == node.prefix_len + len(child.key), "bad prefix_len"
                child_locks += child.lock_ref
            if node is self.root:
                continue
            assert node.lock_ref >= child_locks >= 0, "lock count below its children's"
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            seen.append(node.value)
        assert (evictable, protected) == (self._evictable, self._protected), "size counters drift"
        held = torch.cat(seen) if seen else _EMPTY
        free = self.pool.free_list.free_ids()
        assert held.unique().numel() == held.numel(), "a slot is held twice by the tree"
        assert not bool(torch.isin(held, free).any()), "a tree slot is also in the free list"
        assert self.pool.available() + self.total_size() <= self.pool.size, "slot accounting"
        if idle:
            assert protected == 0, "a radix node is locked while idle"
            assert self.pool.available() + evictable == self.pool.size, (
                f"idle leak: free {self.pool.available()} + evictable {evictable} "
                f"!= total {self.pool.size}")
        self.pool.check_integrity()


def _common_len(edge: list[int], key: list[int], start: int) -> int:
    n = min(len(edge), len(key) - start)
    # NOTE: list slices compare in C; a token-by-token Python loop cost ~0.1 ms per 2k-token
    # match, and LPM matches every waiting request on every scheduling pass.
    if edge[:n] == key[start:start + n]:
        return n
    i = 0
    while i + 64 <= n and edge[i:i + 64] == key[start + i:start + i + 64]:
        i += 64
    while i < n and edge[i] == key[start + i]:
        i += 1
    return i

"""HiRadixCache: the radix cache over three tiers (device pool, host pool, files).

The tree stays the one index of cached prefixes; each node records where its KV lives:
``value`` (device slots, or None) and ``host_value`` (host slots, or None); a node has at least
one of them. Files (``storage.py``) are found by hashing a prompt's pages, so pages that left
the tree are found again (also by another engine or after a restart); a page read from a file
becomes a host-resident node.

Invariants (checked by ``check_integrity``):

- Device residency is closed upwards: a device-resident node's parent is device-resident (or
  the root). So a match is a device prefix followed by host-only nodes.
- Locks (``lock_ref``) and the evictable/protected counters concern device-resident nodes only;
  host-only nodes are never locked. ``host_ref`` pins a host copy while it is being loaded.
- Host slots held by the tree + free host slots == host pool size (a pending backup's slots are
  already the node's).

Moves between tiers (``moves.py``):

- write_through: a new device node is copied to the host when inserted;
  write_through_selective: when a match hits it the second time; write_back: when evicted.
- Device eviction (LRU over device-resident nodes with no device-resident child) demotes a node
  with a host copy (frees its device slots) and drops one without (with its host-only subtree).
- Host eviction (LRU) frees the host copy of a device-resident node, or removes a host-only
  leaf, writing its pages to the storage tier first.
- ``match_and_load`` (admission) loads the host-only part of a match, plus whatever pages the
  storage tier has past the tree's match, into fresh device slots before the prefill.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..host_pool import HostKVPool
from ..pool import TokenKVPool
from ..radix import MatchResult, RadixCache, TreeNode, _common_len
from . import pages
from .moves import TierMoves
from .storage import FileStorage
from .transfer import KVTransfer

_EMPTY = torch.empty(0, dtype=torch.int64)
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
SELECTIVE_HITS = 2  # write_through_selective: backed up on this many hits (as SGLang)


@dataclass(eq=False)
class HiTreeNode(TreeNode):
    host_value: torch.Tensor | None = None
    host_ref: int = 0  # > 0: the host copy is being read (a load in progress)
    backup: Any = None  # transfer._Backup while the device->host copy may be in flight
    hit_count: int = 0
    load_event: Any = None  # CUDA: the last event of the load that filled ``value``
    backup_queued: bool = False  # in ``_backup_queue``: copied at the next ``issue_backups``

    @property
    def tier(self) -> str:
        return "device" if self.value is not None else "host"

    @property
    def backup_pending(self) -> bool:
        return self.backup is not None and not self.backup.landed


@dataclass(frozen=True)
class HiMatchResult(MatchResult):
    """``slots``/``node``: the device-resident part; ``host_nodes``: the host-only nodes that
    continue the match, in order."""

    host_nodes: tuple = ()

    @property
    def host_length(self) -> int:
        """Tokens past the device match that the host tier holds (a load brings them back)."""
        return sum(len(n.key) for n in self.host_nodes)


class HiRadixCache(TierMoves, RadixCache):
    tiered = True

    def __init__(self, token_pool: TokenKVPool, host_pool: HostKVPool, write_policy: str,
                 storage: FileStorage | None = None, lockstep: bool = False,
                 agree: Callable[[int], int] | None = None, io_backend: str = "kernel"
                 ) -> None:
        """``lockstep``: several ranks run this tree's twin (TP, PP): see ``KVTransfer``.
        ``agree``: then the minimum of an int over the ranks (how many storage pages every
        rank could read: ``pages.fetch``). ``io_backend``: ``hicache_io_backend``."""
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"unknown hicache_write_policy {write_policy!r}")
        self.host = host_pool
        self.transfer = KVTransfer(token_pool, host_pool, lockstep=lockstep,
                                   io_backend=io_backend)
        self.write_policy = write_policy
        self.storage = storage
        self.agree = agree
        self.tier_hits = {"device": 0, "host": 0, "storage": 0}
        self.demoted = self.dropped = self.host_evicted = 0
        super().__init__(token_pool)

    def _new_root(self) -> None:
        self.root = HiTreeNode(key=[], value=_EMPTY)
        self.root.lock_ref = 1  # NOTE: the root is never evicted; its lock is not a request's.
        self._evictable = self._protected = self._host_held = 0
        self._backup_queue: list[HiTreeNode] = []  # write-throughs not issued yet (moves.py)

    def reset(self) -> bool:
        if self._protected:
            return False
        self._backup_queue.clear()  # NOTE: every node goes: nothing to copy
        self.transfer.finish()
        for node in self._nodes():
            if node is not self.root:
                if node.value is not None:
                    self.pool.free(node.value)
                if node.host_value is not None:
                    self.host.free(node.host_value)
        self.host.defragment()
        self._new_root()
        self.reset_stats()
        return True

    def close(self) -> None:
        self.transfer.finish()
        if self.storage is not None:
            self.storage.close()

    # ---- matching --------------------------------------------------------------------------
    def _match(self, key: list[int]) -> HiMatchResult:
        if not key:
            return HiMatchResult(_EMPTY, self.root)
        now = next(self._clock)
        node, pos, parts, dev_node, host_nodes = self.root, 0, [], self.root, []
        node.last_access = now
        while pos < len(key) and key[pos] in node.children:
            child = node.children[key[pos]]
            n = _common_len(child.key, key, pos)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            child.last_access = now
            if child.value is not None:
                assert not host_nodes, "a device-resident node under a host-only one"
                parts.append(child.value)
                dev_node = child
            else:
                host_nodes.append(child)
            node, pos = child, pos + n
            if partial:
                break
        slots = torch.cat(parts) if parts else _EMPTY
        return HiMatchResult(slots, dev_node, tuple(host_nodes))

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key)
        upper = HiTreeNode(key=child.key[:n], value=_head(child.value, n), parent=parent,
                           lock_ref=child.lock_ref, last_access=child.last_access,
                           prefix_len=parent.prefix_len + n,
                           host_value=_head(child.host_value, n), host_ref=child.host_ref,
                           backup=child.backup, hit_count=child.hit_count,
                           load_event=child.load_event)
        if child.backup_queued:  # both halves are copied when the queue is issued
            self._queue_backup(upper)
        parent.children[child.key[0]] = upper
        child.key, child.parent = child.key[n:], upper
        child.value, child.host_value = _tail(child.value, n), _tail(child.host_value, n)
        upper.children[child.key[0]] = child
        return upper

    def match_and_load(self, token_ids: Sequence[int]) -> tuple[HiMatchResult, int, int]:
        """Longest prefix over every tier, with its host and storage parts loaded onto the
        device. Returns (the device match, tokens loaded from host, tokens from storage)."""
        key = list(token_ids)
        self.transfer.poll()
        first = self._match(key)
        host_nodes = list(first.host_nodes)
        self.lock(first.node)  # NOTE: the loads' evictions must not take the matched path
        for node in host_nodes:
            node.host_ref += 1
        fetched = None
        try:
            end = first.node.prefix_len + sum(len(n.key) for n in host_nodes)
            if self.storage is not None and end < len(key):
                attach = host_nodes[-1] if host_nodes else first.node
                fetched = pages.fetch(self, key, end, attach)
            if fetched is not None:
                fetched.host_ref += 1
                host_nodes.append(fetched)
            from_host, from_storage = self._load(host_nodes, fetched)
        finally:
            for node in host_nodes:
                node.host_ref -= 1
            self.unlock(first.node)
        # NOTE: nothing loaded: the first match stands (the common case; no second walk).
        result = self._match(key) if from_host or from_storage else first
        self.query_tokens += len(key)
        self.hit_tokens += result.length
        if self.write_policy == "write_through_selective":
            self._count_hits(result.node)
        return result, from_host, from_storage

    def load_needed(self, host_length: int) -> bool:
        """Whether a request whose match found ``host_length`` host tokens must be admitted
        through ``match_and_load``: a load, pages storage may hold, or selective hits to count."""
        return (host_length > 0 or self.storage is not None
                or self.write_policy == "write_through_selective")

    def _load(self, host_nodes: list[HiTreeNode], fetched: HiTreeNode | None) -> tuple[int, int]:
        """Give the longest run of ``host_nodes`` that fits device slots and copy them in."""
        if not host_nodes:
            return 0, 0
        # NOTE: a backup still in flight is ordered before the load on the device (the load
        # stream waits for its event); only one through pinned staging lands on the host.
        if any(n.backup_pending and n.backup.staging is not None for n in host_nodes):
            self.transfer.finish()
        room, take = self.pool.available() + self._evictable, []
        for node in host_nodes:
            if len(node.key) > room:
                break
            take.append(node)
            room -= len(node.key)
        n = sum(len(node.key) for node in take)
        if n == 0:
            return 0, 0
        if self.pool.available() < n:
            self.evict(n - self.pool.available())
        slots = self.pool.alloc(n)
        if slots is None:
            return 0, 0
        filling = [node.backup.event for node in take if node.backup_pending]
        event = self.transfer.load(torch.cat([node.host_value for node in take]), slots,
                                   filling)
        off = 0
        for node in take:
            node.value, node.load_event = slots[off:off + len(node.key)], event
            off += len(node.key)
            self._evictable += len(node.key)
        from_storage = len(fetched.key) if fetched is not None and fetched in take else 0
        return n - from_storage, from_storage

    def _count_hits(self, node: TreeNode) -> None:
        while node is not self.root:
            node.hit_count += 1
            if node.hit_count >= SELECTIVE_HITS and node.host_value is None:
                self._queue_backup(node)
            node = node.parent

    # ---- insertion -------------------------------------------------------------------------
    def insert(self, token_ids: Sequence[int], slots: torch.Tensor) -> int:
        """As ``RadixCache.insert``; host-only nodes on the path adopt the caller's device slots
        (they are not duplicates of tree slots), so the return value is the device match."""
        key = list(token_ids)
        assert len(key) == int(slots.numel()), "insert: one slot per token"
        if not key:
            return 0
        slots = slots.to("cpu", torch.int64)
        self.transfer.poll()
        match = self._match(key)
        node, pos = match.node, match.length
        for host_node in match.host_nodes:
            host_node.value = slots[pos:pos + len(host_node.key)].clone()
            self._evictable += len(host_node.key)
            node, pos = host_node, pos + len(host_node.key)
        if pos < len(key):
            leaf = HiTreeNode(key=key[pos:], value=slots[pos:].clone(), parent=node,
                              last_access=node.last_access,
                              prefix_len=node.prefix_len + len(key) - pos)
            node.children[key[pos]] = leaf
            self._evictable += len(leaf.key)
            if self.write_policy == "write_through":
                self._queue_backup(leaf)  # NOTE: copied at the step's end (issue_backups)
        return match.length

    # ---- scheduler conveniences, sizes, stats ------------------------------------------------
    def admitted(self, prefix: int, loaded: list[int]) -> dict[str, int]:
        """Per-tier split of a request's cached prefix at its first admission (counted)."""
        host = min(loaded[0], prefix)
        storage = min(loaded[1], prefix - host)
        details = {"device": prefix - host - storage, "host": host, "storage": storage}
        for tier, n in details.items():
            self.tier_hits[tier] += n
        return details

    def host_size(self) -> int:
        return self._host_held

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        out.update(self.hicache_stats())
        return out

    def hicache_stats(self) -> dict[str, float | int]:
        out = {f"hicache_{tier}_hit_tokens": n for tier, n in self.tier_hits.items()}
        out.update(hicache_host_slots=self.host.size, hicache_host_free_slots=self.host.available(),
                   hicache_host_pinned=int(self.host.pinned),
                   hicache_host_held_tokens=self._host_held, hicache_demoted_tokens=self.demoted,
                   hicache_dropped_tokens=self.dropped,
                   hicache_host_evicted_tokens=self.host_evicted, **self.transfer.stats())
        if self.storage is not None:
            out.update(self.storage.stats())
        return out

    def check_integrity(self, idle: bool = False) -> None:
        if idle:
            self.issue_backups()
            self.transfer.finish()  # NOTE: idle means no copy queued or in flight either
        from .integrity import check_tree

        check_tree(self, idle)


def _head(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else t[:n]


def _tail(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else t[n:]

"""How KV moves down the tiers (a mixin of ``HiRadixCache``; tree.py has the invariants).

- ``_queue_backup`` / ``issue_backups``: write_through (on insert) and selective (on the second
  hit) only *queue* a node; the scheduler issues the queue once per step, after that step's
  launch and read (``KVMemory.issue_backups``), as one device -> host copy: an insert (a prefill
  chunk, a finished request) costs the scheduler an append, and the copies' host time is spent
  while the device runs the step just launched. A queued node is still device-only: evicting
  it issues the queue first (write-through kept: it is demoted, its copy ordered before its
  slots' reuse). ``_backup``: one node's copy now (when the host pool cannot take a whole
  batch). Once a copy has landed, the nodes' pages go on to storage.
- ``evict`` (device): LRU over device-resident nodes with no device-resident child; a node with
  a host copy is demoted (device slots freed), one without is dropped with its host subtree.
  write_back copies the victims first, as one batch (as queued write-throughs).
- ``_evict_host``: LRU; frees the host copy of a device-resident node, or removes a host-only
  leaf after writing its pages to storage.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any

import torch

from . import pages


class TierMoves:
    """Needs the tree's pools, counters and ``transfer``/``storage`` (see HiRadixCache)."""

    def _queue_backup(self, node: Any) -> None:
        """Back ``node`` up at the next ``issue_backups`` (or before it is evicted)."""
        if not node.backup_queued and node.host_value is None and node.value is not None:
            node.backup_queued = True
            self._backup_queue.append(node)

    def end_step(self) -> int:
        """The scheduler step's end (``KVMemory.issue_backups``, once a step on every rank):
        the transfer's lockstep clock ticks, the step's write-throughs are issued."""
        self.transfer.tick()
        return self.issue_backups()

    def issue_backups(self) -> int:
        """Start the queued nodes' device -> host copies, as one copy (one host allocation, one
        ``transfer.backup``: per layer a few copies, however many nodes). Returns the tokens."""
        queue, self._backup_queue = self._backup_queue, []
        nodes = []
        for node in queue:
            if node.backup_queued:  # NOTE: cleared when it was dropped or reset meanwhile
                node.backup_queued = False
                if node.value is not None and node.host_value is None:
                    nodes.append(node)
        if not nodes:
            return 0
        total = sum(len(n.key) for n in nodes)
        host = self._host_alloc(total)
        if host is None:  # the host pool is short (copies being read or filled): as many as fit
            return sum(len(n.key) for n in nodes if self._backup(n))
        off = 0
        for node in nodes:
            node.host_value = host[off:off + len(node.key)]
            off += len(node.key)
        self._host_held += total
        backup = self.transfer.backup(torch.cat([n.value for n in nodes]), host,
                                      lambda: self._backed_up(*nodes))
        for node in nodes:
            node.backup = backup
        return total

    def _backup(self, node: Any) -> bool:
        """Copy a device node to the host now (and its pages on to storage once there)."""
        if node.host_value is not None or node.value is None:
            return node.host_value is not None
        host = self._host_alloc(len(node.key))
        if host is None:
            return False
        node.host_value = host
        self._host_held += len(node.key)
        node.backup = self.transfer.backup(node.value, host, lambda: self._backed_up(node))
        return True

    def _backed_up(self, *nodes: Any) -> None:
        if self.storage is not None:
            for node in nodes:
                if node.host_value is not None:
                    pages.store(self, node)

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` device slots: LRU device leaves go to the host (when
        they have or get a host copy) or are dropped. The victims' missing host copies (queued
        write-throughs; write_back's) leave as one copy first, their slots fenced on it."""
        if num_tokens <= 0 or self._evictable == 0:
            return 0
        self.transfer.poll()
        victims = self._victims(num_tokens)
        if self.write_policy == "write_back":
            for node in victims:
                self._queue_backup(node)
        if any(node.backup_queued for node in victims):
            self.issue_backups()
        for node in victims:  # NOTE: children before their parents (``_victims``)
            if node.host_value is not None:
                self._demote(node)
            else:
                self._drop(node)
        return sum(len(node.key) for node in victims)

    def _victims(self, num_tokens: int) -> list:
        """LRU device leaves (unlocked, no device-resident child) to free ``num_tokens``; a
        parent whose device children are all taken becomes a leaf and joins the queue."""
        taken: set[int] = set()

        def leaf(n: Any) -> bool:
            return (n is not self.root and n.value is not None and n.lock_ref == 0
                    and all(c.value is None or id(c) in taken for c in n.children.values()))
        tie = itertools.count()
        heap = [(n.last_access, next(tie), n) for n in self._device_nodes() if leaf(n)]
        heapq.heapify(heap)
        out, freed = [], 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            taken.add(id(node))
            out.append(node)
            freed += len(node.key)
            if leaf(node.parent):
                heapq.heappush(heap, (node.parent.last_access, next(tie), node.parent))
        return out

    def _device_nodes(self):
        """Device-resident nodes (and the root): host-only subtrees are not entered, since
        device residency is closed upwards (a decode step's eviction walks only these)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(c for c in node.children.values() if c.value is not None)

    def _demote(self, node: Any) -> None:
        self._release_device(node)
        self.pool.free(node.value)
        node.value = None
        self._evictable -= len(node.key)
        self.demoted += len(node.key)

    def _drop(self, node: Any) -> None:
        """Remove an unlocked node without a host copy, with its (host-only) subtree."""
        del node.parent.children[node.key[0]]
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            n.backup_queued = False
            if n.value is not None:
                self._release_device(n)
                self.pool.free(n.value)
                self._evictable -= len(n.key)
                self.dropped += len(n.key)
            self._free_host(n)

    def _release_device(self, node: Any) -> None:
        """Before a node's device slots go back to the pool (CUDA): the copies that may still
        touch them (its backup's gather, its own load) come first on the compute stream."""
        if self.transfer.cuda:
            if node.backup_pending:
                self.transfer.fence(node.backup.event)
            self.transfer.fence(node.load_event)
        node.load_event = None

    def _free_host(self, node: Any) -> None:
        if node.host_value is None:
            return
        assert node.host_ref == 0, "freeing a host copy that is being loaded"
        if node.backup_pending:
            self.transfer.finish()  # its copy must land before the slots are reused
        if node.load_event is not None and not node.load_event.query():
            # NOTE: the load still reads these host rows, and the next owner may write them
            # from the CPU (a storage page) or another stream (a backup): rare (the host LRU
            # takes a just-loaded node last), so the host waits.
            node.load_event.synchronize()
        self.host.free(node.host_value)
        self._host_held -= len(node.key)
        node.host_value, node.backup = None, None

    def _host_alloc(self, n: int) -> torch.Tensor | None:
        if self.host.available() < n:
            self._evict_host(n - self.host.available())
        return self.host.alloc(n)

    def _evict_host(self, num_tokens: int) -> int:
        """Free host slots, LRU: host copies of device nodes, host-only leaves (whose pages go
        to the storage tier first)."""
        self.transfer.poll()
        tie = itertools.count()
        heap = [(n.last_access, next(tie), n) for n in self._nodes() if self._host_victim(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if not self._host_victim(node):  # changed since it was queued
                continue
            freed += len(node.key)
            self.host_evicted += len(node.key)
            if node.value is not None:
                self._free_host(node)
                continue
            if self.storage is not None:
                pages.store(self, node)
            del node.parent.children[node.key[0]]
            self._free_host(node)
            if node.parent.value is None and self._host_victim(node.parent):
                heapq.heappush(heap, (node.parent.last_access, next(tie), node.parent))
        self.host.defragment()
        return freed

    def _host_victim(self, node: Any) -> bool:
        return (node is not self.root and node.host_value is not None and node.host_ref == 0
                and not node.backup_pending and (node.value is not None or not node.children))

"""The tiered tree's integrity check (``HiRadixCache.check_integrity``): structure, residency,
lock and size counters, and slot accounting against both pools."""
from __future__ import annotations

from typing import Any

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)


def check_tree(tree: Any, idle: bool) -> None:
    evictable = protected = host_held = 0
    dev_seen: list[torch.Tensor] = []
    host_seen: list[torch.Tensor] = []
    for node in tree._nodes():
        child_locks = 0
        for first, child in node.children.items():
            assert child.key and child.key[0] == first, "child keyed by the wrong token"
            assert child.parent is node, "broken parent pointer"
            assert child.prefix_len == node.prefix_len + len(child.key), "bad prefix_len"
            if child.value is not None:
                assert node is tree.root or node.value is not None, (
                    "a device-resident node under a host-only one")
            child_locks += child.lock_ref
        if node is tree.root:
            continue
        assert node.value is not None or node.host_value is not None, "a node with no KV"
        assert node.lock_ref >= child_locks >= 0, "lock count below its children's"
        if node.value is not None:
            assert len(node.key) == int(node.value.numel()), "key/value length mismatch"
            dev_seen.append(node.value)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        else:
            assert node.lock_ref == 0, "a host-only node is locked"
        if node.host_value is not None:
            assert len(node.key) == int(node.host_value.numel()), "key/host value mismatch"
            host_seen.append(node.host_value)
            host_held += len(node.key)
        if idle:
            assert node.host_ref == 0, "a host copy is pinned while idle"
            assert not node.backup_pending, "a backup in flight while idle"
    assert (evictable, protected) == (tree._evictable, tree._protected), "size counters drift"
    assert host_held == tree._host_held, "host size counter drift"
    _check_slots(dev_seen, tree.pool.free_list.free_ids(), "device")
    _check_slots(host_seen, tree.host.free_list.free_ids(), "host")
    assert tree.pool.available() + tree.total_size() <= tree.pool.size, "slot accounting"
    assert tree.host.available() + host_held == tree.host.size, (
        f"host leak: free {tree.host.available()} + held {host_held} != total {tree.host.size}")
    if idle:
        assert protected == 0, "a radix node is locked while idle"
        assert tree.pool.available() + evictable == tree.pool.size, (
            f"idle leak: free {tree.pool.available()} + evictable {evictable} "
            f"!= total {tree.pool.size}")
    tree.pool.check_integrity()
    tree.host.check_integrity()


def _check_slots(seen: list[torch.Tensor], free: torch.Tensor, tier: str) -> None:
    held = torch.cat(seen) if seen else _EMPTY
    assert held.unique().numel() == held.numel(), f"a {tier} slot is held twice by the tree"
    assert not bool(torch.isin(held, free).any()), f"a {tier} tree slot is also free"

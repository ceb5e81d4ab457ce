"""Between the tree and the storage tier: which pages a node writes, and reading pages back
into a host-resident node.

Pages are aligned to absolute positions (``PAGE_TOKENS``), nodes are not: a page is written by
the node holding its last token, gathering its first tokens from ancestors' host copies (a page
whose tokens are not all on the host yet is skipped; a later eviction may write it).
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from .storage import PAGE_TOKENS as P

logger = logging.getLogger(__name__)


def fetch(tree: Any, key: list[int], start: int, attach: Any) -> Any:
    """Read the stored pages covering ``key[start:]`` (full pages only, the first one may
    begin before ``start``) into host slots; attach them as a host-only child of ``attach``
    (the node ending at ``start``). None if nothing is stored (or readable).

    Lockstep (TP/PP): every rank reads its own shards, then the ranks agree on the pages that
    all of them could read (``tree.agree``: the minimum over ranks), so a page missing or
    corrupt on one rank is a miss on every rank and the trees stay identical."""
    storage = tree.storage
    first, last = start // P, len(key) // P
    if first >= last:
        return None
    hashes = storage.page_hashes(key, last)
    rows = []
    for p in range(first, last):
        page = storage.read(hashes[p], key[p * P:(p + 1) * P])
        if page is None:  # missing, or corrupt (logged): the prefix ends before it
            break
        rows.append(page)
    usable = tree.agree(len(rows)) if tree.agree is not None else len(rows)
    if usable < len(rows):
        # NOTE: forgotten here too, so every rank's storage holds the same pages again
        logger.warning("hicache storage: skipping page file %s (not usable on every rank)",
                       storage._path(hashes[first + usable]).name)
        storage.forget(hashes[first + usable], unshared=True)
    rows = rows[:usable]
    if not rows:
        return None
    for p in range(first, first + usable):
        # NOTE: before the host allocation, whose evictions may store pages (and keep the
        # budget): the pages being served are the most recent then, not deleted by it
        storage.touch(hashes[p])
    host = tree._host_alloc((first + len(rows)) * P - start)
    if host is None:
        return None
    filled = 0
    for p, page in enumerate(rows, start=first):
        lo = max(start - p * P, 0)
        tree.host.scatter(host[filled:filled + P - lo], page[:, :, lo:])
        filled += P - lo
    from .tree import HiTreeNode

    node = HiTreeNode(key=key[start:start + filled], value=None, host_value=host,
                      parent=attach, last_access=attach.last_access,
                      prefix_len=attach.prefix_len + filled)
    attach.children[key[start]] = node
    tree._host_held += filled
    return node


def store(tree: Any, node: Any) -> None:
    """Queue the pages whose last token is in ``node`` and not stored yet."""
    end = node.prefix_len
    begin = end - len(node.key)
    first, last = begin // P, end // P
    if first >= last:
        return
    path = _path(tree, node)
    tokens = [t for n in path for t in n.key]
    storage = tree.storage
    hashes = storage.page_hashes(tokens, last)
    for p in range(first, last):
        if storage.has(hashes[p]):  # NOTE: its record, not the disk: the same on every rank
            continue
        slots = _host_slots(path, p * P, (p + 1) * P)
        if slots is not None:
            storage.put(hashes[p], tokens[p * P:(p + 1) * P], tree.host.gather(slots))


def _path(tree: Any, node: Any) -> list:
    """Root's child .. ``node``."""
    path = []
    while node is not tree.root:
        path.append(node)
        node = node.parent
    return path[::-1]


def _host_slots(path: list, lo: int, hi: int) -> torch.Tensor | None:
    """Host slots of positions [lo, hi) along ``path``; None if any is not on the host (or
    its copy may still be in flight)."""
    parts = []
    for n in path:
        n_end, n_begin = n.prefix_len, n.prefix_len - len(n.key)
        if n_end <= lo or n_begin >= hi:
            continue
        if n.host_value is None or n.backup_pending:
            return None
        parts.append(n.host_value[max(lo, n_begin) - n_begin:min(hi, n_end) - n_begin])
    return torch.cat(parts)

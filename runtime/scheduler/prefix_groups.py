"""Which decode requests share a cached prefix: groups for cascade decode attention.

Every running request holds a locked path in the radix tree (root -> ``last_node``), and the
first ``node.prefix_len`` slots of its ``req_to_token`` row are that path's slots. Requests
whose paths pass through one node share its whole prefix, slot for slot. Each request joins the
deepest node on its path that another running request also passes through, if that prefix is
long enough to be worth reading once per group instead of once per request.
"""
from __future__ import annotations

from typing import Any

from .req import Req

# NOTE: below this many shared tokens, a separate prefix pass costs more than it saves.
MIN_SHARED_PREFIX = 32


def find_prefix_groups(reqs: list[Req], root: Any,
                       min_len: int = MIN_SHARED_PREFIX) -> list[tuple[int, int, list[int]]]:
    """(row holding the prefix, prefix length, batch indices) per group of >= 2 requests."""
    counts: dict[int, int] = {}
    paths = []
    for req in reqs:
        path, node = [], req.last_node
        while node is not None and node is not root:
            path.append(node)
            counts[id(node)] = counts.get(id(node), 0) + 1
            node = node.parent
        paths.append(path)
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, path in enumerate(paths):
        for node in path:  # deepest first
            if counts[id(node)] >= 2:
                if node.prefix_len >= min_len:
                    groups.setdefault(id(node), (node, []))[1].append(i)
                break
    # NOTE: a node shared with requests that all joined deeper groups may be left with one
    # member; such a request simply reads its whole sequence itself.
    return [(reqs[m[0]].req_pool_idx, node.prefix_len, m)
            for node, m in groups.values() if len(m) >= 2]

"""Randomized test of the tiered tree: overlapping requests (match and load, extend, cache a
chunk, finish) over small device and host pools and a storage dir, under every write policy.
Each token's KV is a function of its whole prefix, so any slot served for the wrong prefix (a
bad split, adoption, demotion, load or stored page) fails the check on the next match; the
integrity check runs after every operation and the idle check at the end."""
from __future__ import annotations

import random
import zlib

import pytest
import torch

from sgdsl.runtime.cache.hicache import transfer
from sgdsl.runtime.cache.hicache.storage import PAGE_TOKENS, FileStorage
from sgdsl.runtime.cache.hicache.tree import HiRadixCache
from sgdsl.runtime.cache.host_pool import HostKVPool
from sgdsl.runtime.cache.pool import TokenKVPool

from .test_hicache_tree import COPY_PATHS


def _kv(prefix: list[int]) -> float:
    return float(zlib.crc32(str(prefix).encode()))  # exact in float64


class _Req:
    def __init__(self, tree: HiRadixCache, ids: list[int]) -> None:
        self.ids = ids
        res, _, _ = tree.match_and_load(ids[:-1])
        for pos, slot in enumerate(res.slots.tolist()):
            assert tree.pool.k_buffer[0][slot, 0, 0].item() == _kv(ids[:pos + 1]), pos
            assert tree.pool.v_buffer[1][slot, 0, 0].item() == -_kv(ids[:pos + 1]), pos
        tree.lock(res.node)
        self.slots, self.node = res.slots, res.node


def _extend(tree: HiRadixCache, req: _Req) -> bool:
    pool, n = tree.pool, len(req.ids) - len(req.slots)
    if pool.available() < n:
        tree.evict(n - pool.available())
    new = pool.alloc(n)
    if new is None:
        return False
    for j, slot in enumerate(new.tolist()):
        prefix = req.ids[:len(req.slots) + j + 1]
        for layer in range(2):
            pool.k_buffer[layer][slot] = _kv(prefix)
            pool.v_buffer[layer][slot] = -_kv(prefix)
    req.slots = torch.cat([req.slots, new])
    return True


@pytest.mark.parametrize("policy", ["write_through", "write_back", "write_through_selective"])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("path", list(COPY_PATHS))  # pool to pool, mixed, gathered
def test_random_requests_keep_every_tier_consistent(policy, seed, path, tmp_path, monkeypatch):
    for name, value in COPY_PATHS[path].items():
        monkeypatch.setattr(transfer, name, value)
    rng = random.Random(seed)
    pool = TokenKVPool(160, 2, 1, 2, torch.float64, "cpu")
    storage = FileStorage(tmp_path, f"prop-{policy}", 1 << 20, (2, 2, PAGE_TOKENS, 1, 2),
                          torch.float64)
    tree = HiRadixCache(pool, HostKVPool(240, pool, pin_memory=False), policy, storage)
    heads = [[rng.randrange(4) for _ in range(rng.randrange(20, 90))] for _ in range(5)]
    active: list[_Req] = []
    for _ in range(250):
        op = rng.random()
        if op < 0.5 or not active:
            head = rng.choice(heads)
            ids = head[:rng.randrange(1, len(head) + 1)] + [rng.randrange(4)
                                                          for _ in range(rng.randrange(1, 12))]
            req = _Req(tree, ids)
            if len(active) < 3 and _extend(tree, req):
                active.append(req)
            else:
                tree.unlock(req.node)
        elif op < 0.65:  # a chunk: cache what is computed so far, keep running
            req = rng.choice(active)
            req.slots, req.node = tree.cache_unfinished_req(req.ids, req.slots, req.node)
        else:
            req = active.pop(rng.randrange(len(active)))
            tree.cache_finished_req(req.ids, req.slots, req.node)
        tree.check_integrity()
    for req in active:
        tree.cache_finished_req(req.ids, req.slots, req.node)
    tree.check_integrity(idle=True)
    stats = tree.hicache_stats()
    assert stats["hicache_demoted_tokens"] + stats["hicache_dropped_tokens"] > 0
    assert stats["hicache_loads_total"] > 0  # host (and storage) hits were loaded and checked
    assert (stats["hicache_direct_moves_total"] > 0) == (path != "gathered")  # the path tested
    tree.close()

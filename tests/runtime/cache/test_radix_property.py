"""Randomized property test of the radix cache against a simple reference model: a dict from every
cached token prefix (a tuple) to the KV slot of its last token. Random sequences of
insert / match / lock / unlock / evict / finish-request operations; integrity checked after each."""
from __future__ import annotations

import random

import pytest
import torch

from sgdsl.runtime.cache.pool import TokenKVPool
from sgdsl.runtime.cache.radix import RadixCache, TreeNode

POOL_SLOTS = 48


def tree_prefixes(cache: RadixCache) -> dict[tuple[int, ...], int]:
    """Every prefix the tree holds -> its slot, by walking the tree."""
    out: dict[tuple[int, ...], int] = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            p = path
            for tok, slot in zip(child.key, child.value.tolist()):
                p = p + (tok,)
                out[p] = slot
            stack.append((child, p))
    return out


class Model:
    """Reference: prefix -> slot; locks as the prefixes they protect."""

    def __init__(self) -> None:
        self.cached: dict[tuple[int, ...], int] = {}
        self.locks: list[tuple[TreeNode, tuple[int, ...]]] = []
        self.memos: list[tuple[list[int], TreeNode]] = []  # (key, node its last match ended at)

    def match_len(self, ids: list[int]) -> int:
        n = 0
        while n < len(ids) and tuple(ids[: n + 1]) in self.cached:
            n += 1
        return n

    def protected(self) -> set[tuple[int, ...]]:
        return {p[:i] for _, p in self.locks for i in range(1, len(p) + 1)}


def random_ids(rng: random.Random, model: Model) -> list[int]:
    # Small alphabet and extensions of cached sequences, so prefixes are shared and nodes split.
    base = list(rng.choice(list(model.cached))) if model.cached and rng.random() < 0.6 else []
    base = base[: rng.randint(0, len(base))]
    return base + [rng.randint(0, 3) for _ in range(rng.randint(1, 6))]


def op_finish(cache: RadixCache, model: Model, rng: random.Random) -> None:
    """A request: match + lock, compute the rest with fresh slots, then cache_finished_req."""
    ids = random_ids(rng, model)
    m = cache.match_prefix(ids)
    assert m.length == model.match_len(ids)
    assert m.slots.tolist() == [model.cached[tuple(ids[: i + 1])] for i in range(m.length)]
    model.memos.append((ids, m.node))
    cache.lock(m.node)
    need = len(ids) - m.length
    if cache.pool.available() < need:
        cache.evict(need - cache.pool.available())
        sync_after_evict(cache, model)
    own = cache.pool.alloc(need)
    if own is None:  # everything else is locked: give up like a scheduler would
        cache.unlock(m.node)
        return
    slots = torch.cat([m.slots, own])
    cache.cache_finished_req(ids, slots, m.node)
    for i in range(len(ids)):
        model.cached.setdefault(tuple(ids[: i + 1]), int(slots[i]))


def op_lock(cache: RadixCache, model: Model, rng: random.Random) -> None:
    ids = random_ids(rng, model)
    m = cache.match_prefix(ids)
    assert m.length == model.match_len(ids)
    if m.length:
        cache.lock(m.node)
        model.locks.append((m.node, tuple(ids[: m.length])))


def op_rematch(cache: RadixCache, model: Model, rng: random.Random) -> None:
    """A remembered match (scheduler LPM's memo) holds exactly when a fresh match of its key
    ends at the same node, and then gives the same length, slots and access refresh."""
    if not model.memos:
        return
    i = rng.randrange(len(model.memos))
    ids, node = model.memos[i]
    query = cache.query_tokens
    got = cache.rematch(node, ids + [99], len(ids))  # tokens past the length are not read
    if got is not None:
        assert cache.query_tokens == query + len(ids)
        clock = node.last_access
        assert cache.root.last_access == clock, "the path was not refreshed"
        assert got == model.match_len(ids)
        assert cache.path_slots(node).tolist() == [model.cached[tuple(ids[: k + 1])]
                                                    for k in range(got)]
    fresh = cache.match_prefix(ids)
    assert (got is not None) == (fresh.node is node)
    model.memos[i] = (ids, fresh.node)


def op_unlock(cache: RadixCache, model: Model, rng: random.Random) -> None:
    if model.locks:
        node, _ = model.locks.pop(rng.randrange(len(model.locks)))
        cache.unlock(node)


def op_evict(cache: RadixCache, model: Model, rng: random.Random) -> None:
    evictable = set(model.cached) - model.protected()
    assert cache.evictable_size() == len(evictable)
    want = rng.randint(1, 12)
    freed = cache.evict(want)
    removed = sync_after_evict(cache, model)
    assert len(removed) == freed >= min(want, len(evictable))
    assert removed <= evictable, "evicted a locked prefix"


def sync_after_evict(cache: RadixCache, model: Model) -> set[tuple[int, ...]]:
    now = tree_prefixes(cache)
    assert set(now) <= set(model.cached)
    assert all(p[:-1] in now or len(p) == 1 for p in now), "tree not prefix-closed"
    assert all(model.cached[p] == s for p, s in now.items()), "a slot moved"
    removed = set(model.cached) - set(now)
    model.cached = {p: model.cached[p] for p in now}
    return removed


@pytest.mark.parametrize("seed", range(25))
def test_random_operations_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    pool = TokenKVPool(POOL_SLOTS, num_layers=1, num_kv_heads=1, head_dim=1,
                       dtype=torch.float32, device="cpu")
    cache = RadixCache(pool)
    model = Model()
    ops = [op_finish] * 4 + [op_lock, op_unlock, op_evict, op_rematch] * 2
    for _ in range(80):
        rng.choice(ops)(cache, model, rng)
        assert tree_prefixes(cache) == model.cached
        assert cache.protected_size() == len(model.protected())
        # No request holds slots outside the tree here, so the accounting is exact.
        assert pool.available() + cache.total_size() == POOL_SLOTS
        cache.check_integrity()
    while model.locks:
        op_unlock(cache, model, rng)
    cache.check_integrity(idle=True)
    cache.evict(POOL_SLOTS)
    assert cache.total_size() == 0 and pool.available() == POOL_SLOTS

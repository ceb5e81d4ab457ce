"""Unit tests of the radix prefix cache: match/split, insert dedup, locks, LRU eviction,
scheduler conveniences, the disabled cache and the idle invariant."""
from __future__ import annotations

import torch

from sgdsl.runtime.cache.pool import TokenKVPool
from sgdsl.runtime.cache.radix import RadixCache


def make(num_slots: int = 64, disable: bool = False) -> RadixCache:
    pool = TokenKVPool(num_slots, num_layers=1, num_kv_heads=1, head_dim=2,
                       dtype=torch.float32, device="cpu")
    return RadixCache(pool, disable=disable)


def put(cache: RadixCache, ids: list[int]) -> torch.Tensor:
    """Allocate slots for ids, insert, free the duplicates (prefix_len 0): like a finished request."""
    slots = cache.pool.alloc(len(ids))
    n = cache.insert(ids, slots)
    cache.pool.free(slots[:n])
    return slots


def test_match_empty_and_miss() -> None:
    cache = make()
    assert cache.match_prefix([]).length == 0
    res = cache.match_prefix([1, 2, 3])
    assert res.length == 0 and res.node is cache.root
    cache.check_integrity(idle=True)


def test_insert_then_match_full_and_partial_splits_node() -> None:
    cache = make()
    slots = put(cache, [1, 2, 3, 4, 5])
    full = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert full.slots.tolist() == slots.tolist()
    part = cache.match_prefix([1, 2, 3, 9])
    assert part.slots.tolist() == slots[:3].tolist()
    assert part.node.prefix_len == 3 and part.node.key == [1, 2, 3]
    assert len(part.node.children) == 1
    assert cache.stats()["num_nodes"] == 2
    assert cache.total_size() == 5
    cache.check_integrity(idle=True)


def test_insert_returns_already_cached_prefix_length() -> None:
    cache = make()
    first = put(cache, [1, 2, 3])
    free_before = cache.pool.available()
    dup = cache.pool.alloc(5)
    n = cache.insert([1, 2, 3, 7, 8], dup)
    assert n == 3
    cache.pool.free(dup[:n])  # caller frees its duplicates
    assert cache.pool.available() == free_before - 2
    m = cache.match_prefix([1, 2, 3, 7, 8])
    assert m.slots.tolist() == first.tolist() + dup[3:].tolist()
    again = cache.pool.alloc(2)
    assert cache.insert([1, 2], again) == 2  # fully cached: nothing adopted
    cache.pool.free(again)
    cache.check_integrity(idle=True)


def test_hit_rate_stats() -> None:
    cache = make()
    put(cache, [1, 2, 3, 4])
    cache.match_prefix([1, 2, 9, 9])  # 2 of 4 hit
    cache.match_prefix([5, 6])  # 0 of 2
    st = cache.stats()
    assert st["cache_hit_tokens"] == 2 and st["cache_query_tokens"] == 6
    assert abs(st["cache_hit_rate"] - 2 / 6) < 1e-12


def test_lock_protects_path_and_unlock_restores() -> None:
    cache = make()
    put(cache, [1, 2, 3, 4])
    put(cache, [1, 2, 5, 6])
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)
    assert cache.protected_size() == 4 and cache.evictable_size() == 2
    cache.check_integrity()
    assert cache.evict(100) == 2  # only the unlocked [5, 6] branch can go
    assert cache.match_prefix([1, 2, 3, 4]).length == 4
    assert cache.match_prefix([1, 2, 5, 6]).length == 2
    cache.unlock(node)
    assert cache.protected_size() == 0 and cache.evictable_size() == 4
    cache.check_integrity(idle=True)


def test_evict_lru_order_and_cascade() -> None:
    cache = make()
    put(cache, [1, 2, 3])
    put(cache, [4, 5, 6])
    put(cache, [7, 8])
    cache.match_prefix([1, 2, 3])  # [1,2,3] now most recent; [4,5,6] is the oldest
    assert cache.evict(1) == 3
    assert cache.match_prefix([4, 5, 6]).length == 0
    assert cache.match_prefix([7, 8]).length == 2  # refresh: [1,2,3] is now the oldest
    assert cache.evict(3) == 3
    assert cache.match_prefix([1, 2, 3]).length == 0
    # Cascade: a split parent becomes a leaf once both children go.
    put(cache, [9, 9, 1])
    put(cache, [9, 9, 2])
    assert cache.evict(cache.evictable_size()) == 6
    assert cache.total_size() == 0 and cache.stats()["num_nodes"] == 0
    cache.check_integrity(idle=True)


def test_evict_zero_and_nothing_evictable() -> None:
    cache = make()
    assert cache.evict(5) == 0
    put(cache, [1, 2])
    assert cache.evict(0) == 0
    assert cache.total_size() == 2


def test_cache_finished_req_frees_duplicates_and_unlocks() -> None:
    cache = make(num_slots=32)
    put(cache, [1, 2, 3])
    # Request A matched [1,2] then computed up to [1,2,3,4,5] with its own slots beyond the prefix.
    match = cache.match_prefix([1, 2])
    cache.lock(match.node)
    own = cache.pool.alloc(3)
    slots = torch.cat([match.slots, own])
    cache.cache_finished_req([1, 2, 3, 4, 5], slots, match.node)
    # Position 2 ([3]) was already cached: A's slot for it is freed; [4, 5] adopted by the tree.
    assert cache.total_size() == 5
    assert cache.pool.available() + cache.total_size() == cache.pool.size
    assert cache.match_prefix([1, 2, 3, 4, 5]).slots[3:].tolist() == own[1:].tolist()
    cache.check_integrity(idle=True)


def test_cache_unfinished_req_moves_lock_and_returns_tree_slots() -> None:
    cache = make(num_slots=32)
    root = cache.root
    first = cache.pool.alloc(4)
    new_slots, node = cache.cache_unfinished_req([1, 2, 3, 4], first, root)
    assert new_slots.tolist() == first.tolist() and node.prefix_len == 4
    assert cache.protected_size() == 4
    # Another request caches [1,2,3,4,5,6] meanwhile; ours extends to 6 with duplicate slots.
    other = put(cache, [1, 2, 3, 4, 5, 6])
    more = cache.pool.alloc(2)
    slots = torch.cat([new_slots, more])
    new_slots, node2 = cache.cache_unfinished_req([1, 2, 3, 4, 5, 6], slots, node)
    assert new_slots.tolist() == first.tolist() + other[4:].tolist()
    assert node2.prefix_len == 6 and node.lock_ref == 1 and node2.lock_ref == 1
    cache.check_integrity()
    cache.cache_finished_req([1, 2, 3, 4, 5, 6], new_slots, node2)
    cache.check_integrity(idle=True)


def test_disabled_cache_is_a_noop_that_frees_on_finish() -> None:
    cache = make(num_slots=16, disable=True)
    slots = cache.pool.alloc(5)
    assert cache.insert([1, 2, 3, 4, 5], slots) == 0
    m = cache.match_prefix([1, 2, 3])
    assert m.length == 0 and m.node is cache.root
    cache.cache_finished_req([1, 2, 3, 4, 5], slots, m.node)
    assert cache.total_size() == 0 and cache.pool.available() == 16
    cache.check_integrity(idle=True)


def test_reset_frees_all_and_refuses_while_locked() -> None:
    cache = make(num_slots=16)
    put(cache, [1, 2, 3])
    node = cache.match_prefix([1, 2]).node
    cache.lock(node)
    assert cache.reset() is False
    cache.unlock(node)
    assert cache.reset() is True
    assert cache.total_size() == 0 and cache.pool.available() == 16
    assert cache.stats()["cache_query_tokens"] == 0
    cache.check_integrity(idle=True)


def test_integrity_detects_a_leak() -> None:
    cache = make(num_slots=8)
    cache.pool.alloc(2)  # leaked: neither free nor in the tree
    try:
        cache.check_integrity(idle=True)
    except AssertionError as e:
        assert "idle leak" in str(e)
    else:
        raise AssertionError("leak not detected")

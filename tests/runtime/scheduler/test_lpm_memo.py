"""LPM's scheduling pass reuses each waiting request's last prefix match (``Req.match_memo``,
``RadixCache.rematch``): no walk over a 2k-token prompt per request per step while the tree
keeps its match, the same order and lengths as fresh matches whatever the tree did meanwhile."""
from __future__ import annotations

import random

import torch

from sgdsl.runtime.cache.pool import ReqToTokenPool, TokenKVPool
from sgdsl.runtime.cache.radix import RadixCache
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.memory import KVMemory
from sgdsl.runtime.scheduler.policy import SchedulePolicy
from sgdsl.runtime.scheduler.req import Req

SP = SamplingParams.from_dict({"max_new_tokens": 8})


def setup(rng: random.Random, slots: int = 40_000, prefix: int = 2048):
    pool = TokenKVPool(slots, 1, 1, 1, torch.float32, "cpu")
    tree = RadixCache(pool)
    memory = KVMemory(ReqToTokenPool(4, 8, "cpu"), pool, tree)
    groups = [[rng.randrange(1000, 30000) for _ in range(prefix)] for _ in range(4)]
    for g in groups[:3]:  # the fourth group is not cached yet
        ids = g + [rng.randrange(1000, 30000) for _ in range(64)]
        tree.insert(ids, pool.alloc(len(ids)))
    waiting = [Req(str(i), rng.choice(groups) + [rng.randrange(1000, 30000) for _ in range(32)],
                   SP, arrival=i) for i in range(32)]
    return tree, memory, SchedulePolicy("lpm", memory), groups, waiting


class Walks:
    """Counts the tree's full walks (``_match``) and token comparisons (``_common_len``)."""

    def __init__(self, monkeypatch) -> None:
        import sgdsl.runtime.cache.radix as radix

        self.walks = self.compares = 0
        match, common = RadixCache._match, radix._common_len

        def counted_match(tree, key):
            self.walks += 1
            return match(tree, key)

        def counted_common(*args):
            self.compares += 1
            return common(*args)
        monkeypatch.setattr(RadixCache, "_match", counted_match)
        monkeypatch.setattr(radix, "_common_len", counted_common)


def fresh_lengths(tree: RadixCache, waiting: list[Req]) -> list[int]:
    return [tree.match_prefix(r.all_ids[: r.max_prefix_len]).length for r in waiting]


def test_a_second_pass_walks_no_prompt(monkeypatch) -> None:
    tree, memory, policy, _, waiting = setup(random.Random(0))
    walks = Walks(monkeypatch)
    first = policy.order(waiting)
    assert walks.walks == len(waiting)  # the first pass matches every request
    lengths = [r.match_len for r in waiting]
    assert sorted(set(lengths)) == [0, 2048]
    walks.walks = walks.compares = 0
    for _ in range(3):
        assert policy.order(waiting) == first
    assert walks.walks == walks.compares == 0
    assert [r.match_len for r in waiting] == lengths
    # what admission takes: the same slots and node as a fresh match
    slots, node = memory.match(waiting[0])
    assert walks.walks == 0
    fresh = tree.match_prefix(waiting[0].all_ids[: waiting[0].max_prefix_len])
    assert node is fresh.node and torch.equal(slots, fresh.slots)


def test_memo_follows_inserts_evictions_and_flush() -> None:
    rng = random.Random(1)
    tree, memory, policy, groups, waiting = setup(rng)
    policy.order(waiting)
    # the uncached group arrives in the tree: its waiting requests now match 2048 tokens
    ids = groups[3] + [7] * 16
    tree.insert(ids, tree.pool.alloc(len(ids)))
    policy.order(waiting)
    assert [r.match_len for r in waiting] == fresh_lengths(tree, waiting)
    assert any(r.match_len == 2048 and r.all_ids[:2048] == groups[3] for r in waiting)
    # a request's own prompt cached past the group prefix: it matches its whole key
    own = waiting[0]
    tree.insert(own.origin_input_ids, tree.pool.alloc(own.prompt_len))
    policy.order(waiting)
    assert own.match_len == own.max_prefix_len
    # everything evicted, then a flush: nothing matches any more
    tree.evict(tree.evictable_size())
    policy.order(waiting)
    assert [r.match_len for r in waiting] == [0] * len(waiting)
    tree.insert(ids, tree.pool.alloc(len(ids)))
    policy.order(waiting)
    assert tree.reset()
    policy.order(waiting)
    assert [r.match_len for r in waiting] == [0] * len(waiting)


def test_random_tree_changes_give_fresh_orders() -> None:
    """Random inserts, splits (short shared keys), evictions and retractions (a new epoch and
    key): every pass gives the order and lengths of fresh matches."""
    rng = random.Random(2)
    tree, memory, policy, groups, waiting = setup(rng, slots=20_000, prefix=64)
    for _ in range(60):
        op = rng.random()
        if op < 0.4:
            g = rng.choice(groups)
            ids = g[: rng.randrange(1, len(g) + 1)] + [rng.randrange(1000, 1004)
                                                       for _ in range(rng.randrange(0, 8))]
            tree.insert(ids, tree.pool.alloc(len(ids)))
        elif op < 0.6:
            tree.evict(rng.randrange(1, 200))
        elif op < 0.7:  # a retraction: output tokens, a new epoch
            req = rng.choice(waiting)
            req.output_ids.append(rng.randrange(1000, 30000))
            req.reset_kv_state()
        ordered = policy.order(waiting)
        lengths = [r.match_len for r in waiting]
        for r in waiting:
            r.match_memo = None
        assert policy.order(waiting) == ordered
        assert [r.match_len for r in waiting] == lengths == fresh_lengths(tree, waiting)

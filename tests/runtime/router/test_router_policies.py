"""Each policy routes as specified (fake workers: only URL and load matter to a policy)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.router.policies import make_policy
from sgdsl.runtime.router.worker import Worker

URLS = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 5))


def setup(policy: str, n: int = 3, **kw):
    config = RouterConfig(worker_urls=URLS[:n], policy=policy, **kw)
    p = make_policy(config, random.Random(0))
    workers = [Worker(u) for u in config.worker_urls]
    for w in workers:
        p.on_add(w.url)
    return p, workers


def test_round_robin_cycles_and_skips_unavailable():
    p, ws = setup("round_robin")
    assert [p.select(ws, "x").worker.url for _ in range(6)] == [w.url for w in ws] * 2
    picks = {p.select(ws[:2], "x").worker.url for _ in range(4)}
    assert picks == {ws[0].url, ws[1].url}


def test_random_covers_all_workers_roughly_evenly():
    p, ws = setup("random")
    counts = Counter(p.select(ws, "x").worker.url for _ in range(3000))
    assert set(counts) == {w.url for w in ws}
    assert min(counts.values()) > 800


def test_power_of_two_never_picks_the_most_loaded_of_three():
    p, ws = setup("power_of_two")
    ws[0].load, ws[1].load, ws[2].load = 9, 1, 5
    picks = Counter(p.select(ws, "x").worker.url for _ in range(300))
    assert ws[0].url not in picks  # always beaten by the other worker of its pair
    assert picks[ws[1].url] > picks[ws[2].url]  # least loaded wins every pair it is in
    assert p.select(ws[:1], "x").worker is ws[0]


def test_prefix_hash_is_sticky_spread_and_consistent():
    p, ws = setup("prefix_hash", n=4, prefix_chars=16)
    texts = [f"system prompt {i:02d}... then a question {j}" for i in range(40) for j in range(3)]
    owner = {t[:16]: p.select(ws, t).worker.url for t in texts}
    for t in texts:  # same prefix, same worker
        assert p.select(ws, t).worker.url == owner[t[:16]]
    assert len(set(owner.values())) == 4
    # A worker going down moves only its own prefixes; the others stay where they were.
    down = ws[1]
    for prefix, url in owner.items():
        moved = p.select([w for w in ws if w is not down], prefix).worker.url
        assert moved == url or url == down.url
    # Removing and re-adding a worker restores the same assignment (the ring is deterministic).
    p.on_remove(down.url)
    p.on_add(down.url)
    assert {k: p.select(ws, k).worker.url for k in owner} == owner


def test_cache_aware_follows_the_longest_prefix_match():
    p, ws = setup("cache_aware", cache_threshold=0.5)
    a, b = "A" * 100, "B" * 100
    first_a = p.select(ws, a + "q1")
    first_b = p.select(ws, b + "q1")
    assert first_a.reason == first_b.reason == "cache_miss"
    assert first_a.worker is not first_b.worker  # a miss goes to the emptiest tree
    for i in range(5):
        assert p.select(ws, a + f"q{i}").worker is first_a.worker
        assert p.select(ws, b + f"q{i}").reason == "cache_hit"
    # Below the threshold: a short shared prefix is not enough, least-loaded wins.
    first_a.worker.load = 3
    choice = p.select(ws, "A" * 10 + "Z" * 90)
    assert choice.reason == "cache_miss" and choice.worker is not first_a.worker


def test_cache_aware_goes_least_loaded_when_imbalanced():
    p, ws = setup("cache_aware", balance_abs_threshold=4, balance_rel_threshold=1.5)
    home = p.select(ws, "S" * 200).worker
    t_home = p.select(ws, "T" * 200).worker
    assert t_home is not home
    home.load = 10
    for w in ws:
        if w is not home:
            w.load = 2
    choice = p.select(ws, "S" * 200 + "more")
    assert choice.reason == "imbalanced" and choice.worker.load == 2
    t_home.load = home.load = 5  # 5 - 2 = 3 <= abs threshold: balanced, the cache wins again
    choice = p.select(ws, "T" * 200 + "again")
    assert choice.reason == "cache_hit" and choice.worker is t_home


def test_cache_aware_tree_is_bounded_and_forgets_removed_workers():
    p, ws = setup("cache_aware", max_tree_chars=1000)
    for i in range(200):
        p.select(ws, f"{i:04d}" + "x" * 96)
    assert all(t.size <= 1000 for t in p.trees.values())
    p.on_remove(ws[0].url)
    assert ws[0].url not in p.trees


@pytest.mark.parametrize("policy", ["cache_aware", "round_robin", "random", "power_of_two",
                                    "prefix_hash"])
def test_every_policy_only_picks_offered_workers(policy):
    p, ws = setup(policy, n=4)
    for i in range(50):
        offered = ws[i % 4:] or ws
        assert p.select(offered, f"prompt {i}").worker in offered

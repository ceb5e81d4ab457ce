"""The scheduler with the hierarchical cache on, over the stand-in model (its next token is a
function of the ids it reads back from the KV pool, so a wrong slot, a stale host copy or a
lost load changes the output): rounds that overflow the device pool, retraction and aborts
give the reference outputs and leave both pools idle-clean."""
from __future__ import annotations

import pytest

from sgdsl.runtime.ipc import messages as m

from .standin import expected


@pytest.fixture
def hi_harness(make_harness):
    return lambda num_slots, **cfg: make_harness(num_slots, enable_hierarchical_cache=True,
                                                 hicache_ratio=4.0, **cfg)


@pytest.mark.parametrize("policy", ["write_through", "write_back", "write_through_selective"])
def test_rounds_beyond_the_device_pool(hi_harness, policy):
    h = hi_harness(80, hicache_write_policy=policy)
    docs = [[d + 1] * 3 + list(range(2, 22)) + [d + 1] for d in range(6)]
    for rnd in range(3):
        for d, doc in enumerate(docs):  # one at a time: each evicts an earlier one
            h.submit(f"r{rnd}d{d}", doc + [30 + rnd], max_new_tokens=3, ignore_eos=True)
            h.run()
    for rnd in range(3):
        for d, doc in enumerate(docs):
            assert h.outs[f"r{rnd}d{d}"] == expected(doc + [30 + rnd], 3), (rnd, d)
    stats = h.sched.stats()
    if policy != "write_through_selective":  # selective: one hit per round is not enough
        assert stats["hicache_host_hit_tokens"] >= 6 * 20
    h.check_idle()


def test_retraction_with_tiers_resumes_identically(hi_harness):
    h = hi_harness(40, ratio=0.0)
    prompts = {f"r{i}": [i + 1] * 8 for i in range(3)}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=24, ignore_eos=True)
    h.run()
    assert h.sched.counters["retractions_total"] > 0
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 24), rid
    assert h.sched.stats()["hicache_demoted_tokens"] > 0  # retracted KV went down a tier
    h.check_idle()


def test_abort_with_tiers(hi_harness):
    h = hi_harness(64, chunked_prefill_size=8)
    h.submit("old", list(range(1, 40)), max_new_tokens=2, ignore_eos=True)
    h.run()
    h.submit("filler", list(range(41, 50)) * 5, max_new_tokens=2, ignore_eos=True)
    h.run()  # "old" went to the host
    h.submit("decoding", [1, 2, 3], max_new_tokens=50, ignore_eos=True)
    h.sched.step()
    h.submit("chunked", list(range(1, 40)) + [7], max_new_tokens=5)  # loads "old" back
    h.submit("waiting", [4, 5, 6], max_new_tokens=5)
    h.sched.step()
    assert h.sched.stats()["hicache_bytes_host_to_device"] > 0
    for rid in ("waiting", "chunked", "decoding"):
        h.sched.handle(m.AbortReq(rid, "test abort"))
        assert h.finish[rid]["type"] == "abort"
    h.check_idle()
    h.submit("after", list(range(1, 40)) + [9], max_new_tokens=3, ignore_eos=True)
    h.run()
    assert h.outs["after"] == expected(list(range(1, 40)) + [9], 3)
    h.check_idle()


def test_host_hit_loads_only_when_admitted(hi_harness):
    """A waiting request whose prefix is on the host is not loaded while it cannot be admitted
    (a load for a request that then waits evicts others' prefixes for nothing), and its host
    tokens count against the room admission keeps (they take device slots once loaded)."""
    h = hi_harness(80)
    doc = list(range(1, 31))
    h.submit("first", doc + [40], max_new_tokens=2, ignore_eos=True)
    h.run()
    h.submit("filler", list(range(41, 50)) * 7, max_new_tokens=2, ignore_eos=True)
    h.run()  # "first" went to the host
    assert h.sched.tree.match_prefix(doc).length == 0
    h.submit("big", list(range(2, 52)), max_new_tokens=20, ignore_eos=True)
    h.sched.step()  # "big" takes most of the pool for its decode
    h.submit("again", doc + [41], max_new_tokens=3, ignore_eos=True)
    for _ in range(3):
        h.sched.step()
        assert "again" not in h.outs
        assert h.sched.stats()["hicache_loads_total"] == 0
    h.run()
    assert h.outs["again"] == expected(doc + [41], 3)
    assert h.outs["big"] == expected(list(range(2, 52)), 20)
    assert h.sched.stats()["hicache_host_hit_tokens"] >= 30


@pytest.mark.parametrize("policy", ["lpm", "fcfs"])
def test_concurrent_conversations_beyond_the_device_pool(hi_harness, policy):
    """Multi-turn chat as the GPU benchmark runs it, all conversations at once (batched
    admission, several loads per prefill batch, demotions under decode): every answer is the
    reference's, and the host tier served the later turns."""
    h = hi_harness(80, schedule_policy=policy)
    prompts = {c: [c + 1] * 2 + list(range(3, 21)) + [c + 1] for c in range(6)}
    for turn in range(3):
        for c, p in prompts.items():
            h.submit(f"c{c}t{turn}", p, max_new_tokens=4, ignore_eos=True)
        h.run()
        for c, p in prompts.items():
            out = h.outs[f"c{c}t{turn}"]
            assert out == expected(p, 4), (c, turn)
            prompts[c] = p + out + [30 + turn]
    assert h.sched.stats()["hicache_host_hit_tokens"] > 0


# -- what a miss costs the scheduler thread ----------------------------------------------------
def _drive(h, prompts: dict, api=None, inflight: int = 3, out: int = 4) -> dict[int, int]:
    """Keep ``inflight`` prompts running (a finished one replaced at once), one scheduler step
    at a time, the (stand-in) device finishing each step's work before the next. Returns the
    device -> host copies started per step."""
    queue, live, per_step, step = list(prompts.items()), set(), {}, 0
    transfer = getattr(h.sched.tree, "transfer", None)
    if transfer is not None:
        backup = transfer.backup
        transfer.backup = lambda *a: (per_step.__setitem__(step, per_step.get(step, 0) + 1),
                                      backup(*a))[1]
    while queue or live:
        while queue and len(live) < inflight:
            rid, ids = queue.pop(0)
            h.submit(rid, ids, max_new_tokens=out, ignore_eos=True)
            live.add(rid)
        h.sched.step()
        step += 1
        if api is not None:
            api.advance()
        live -= set(h.finish)
    h.run()
    return per_step


def _count_walks(tree) -> list[int]:
    walks = [0]
    match = tree._match
    tree._match = lambda key: (walks.__setitem__(0, walks[0] + 1), match(key))[1]
    return walks


def test_misses_cost_no_host_wait_and_one_backup_per_step(hi_harness, make_harness):
    """Distinct prompts only (every request misses) through a device pool they overflow, on the
    hierarchical cache's CUDA path (stand-in streams and events: a copy lands one step after it
    was queued): answers are the reference's; the scheduler thread never waits for the device
    (no event or stream synchronize: on a GPU each would stall the next launch); each step's
    write-throughs leave as at most one backup, after its launch; a miss walks the tree exactly
    as often as with the plain radix cache (no second match, no load); evicted prefixes were
    demoted to the host (write-through kept), the host pool evicted in turn."""
    from sgdsl.runtime.cache.hicache.transfer import KVTransfer

    from .fake_cuda import FakeCuda

    prompts = {f"m{i}": [60 + i] + list(range(2, 22)) for i in range(18)}
    h = hi_harness(96)
    api, tree = FakeCuda(), h.sched.tree
    tree.transfer = KVTransfer(tree.pool, tree.host, api=api)
    loads = []
    tree.match_and_load = lambda ids: loads.append(ids)
    walks = _count_walks(tree)
    per_step = _drive(h, prompts, api)
    for rid, ids in prompts.items():
        assert h.outs[rid] == expected(ids, 4), rid
    assert api.host_waits == 0 and api.device_waits > 0
    assert per_step and max(per_step.values()) == 1
    assert loads == []
    stats = h.sched.stats()
    assert stats["hicache_demoted_tokens"] > 0 and stats["hicache_host_evicted_tokens"] > 0
    assert stats["hicache_backups_total"] == sum(per_step.values())

    radix = make_harness(96)
    # NOTE: the plain tree's LPM passes reuse a match that still holds (KVMemory._rematch,
    # O(depth), no walk); the tiered tree always walks: compared here with full walks on both
    radix.sched.memory._rematch = lambda req: None
    radix_walks = _count_walks(radix.sched.tree)
    _drive(radix, prompts)
    assert walks == radix_walks
    assert {rid: radix.outs[rid] for rid in prompts} == {rid: h.outs[rid] for rid in prompts}


def test_a_queued_write_through_is_issued_before_its_node_is_evicted(hi_harness):
    """A prefix cached and evicted before the step's end (when the queue is issued) still goes
    to the host: eviction issues the queue first, so the node is demoted, not dropped, and the
    next request sharing it loads it back."""
    h = hi_harness(48)
    tree = h.sched.tree
    doc = list(range(1, 31))
    h.submit("first", doc + [40], max_new_tokens=2, ignore_eos=True)
    h.run()
    assert tree.hicache_stats()["hicache_host_held_tokens"] >= 30
    h.submit("second", list(range(41, 71)) + [40], max_new_tokens=2, ignore_eos=True)
    h.run()
    node = tree.match_prefix(list(range(41, 71))).node
    tree.host.free(node.host_value)  # as if never issued: queue it again, device-only
    tree._host_held -= len(node.key)
    node.host_value = node.backup = None
    tree._queue_backup(node)
    assert node.backup_queued and node.host_value is None
    assert tree.evict(tree.evictable_size()) > 0
    assert not node.backup_queued and node.value is None and node.host_value is not None
    h.submit("again", list(range(41, 71)) + [9], max_new_tokens=3, ignore_eos=True)
    h.run()
    assert h.outs["again"] == expected(list(range(41, 71)) + [9], 3)
    assert h.sched.stats()["hicache_host_hit_tokens"] >= 30


def test_later_turns_load_without_host_waits(hi_harness):
    """Conversations whose later turns come back from the host (loads layer by layer on the
    CUDA path's stand-in streams, while other turns miss and write through): the answers are
    the reference's and the scheduler thread never waits for the device."""
    from sgdsl.runtime.cache.hicache.transfer import KVTransfer

    from .fake_cuda import FakeCuda

    h = hi_harness(96)
    api, tree = FakeCuda(), h.sched.tree
    tree.transfer = KVTransfer(tree.pool, tree.host, api=api)
    prompts = {f"c{i}": [60 + i] + list(range(2, 22)) for i in range(8)}
    for turn in range(3):
        _drive(h, {f"{c}t{turn}": p for c, p in prompts.items()}, api)
        for c, p in prompts.items():
            out = h.outs[f"{c}t{turn}"]
            assert out == expected(p, 4), (c, turn)
            prompts[c] = p + out + [30 + turn]
    stats = h.sched.stats()
    assert stats["hicache_loads_total"] > 0 and stats["hicache_host_hit_tokens"] > 0
    assert api.host_waits == 0


def test_write_back_copies_each_evictions_victims_at_once(hi_harness):
    """write_back on misses: nothing is copied until an eviction, which copies all its victims
    as one backup before freeing their slots (on the stand-in CUDA path: no host wait); the
    victims are demoted, answers are the reference's."""
    from sgdsl.runtime.cache.hicache.transfer import KVTransfer

    from .fake_cuda import FakeCuda

    h = hi_harness(96, hicache_write_policy="write_back")
    api, tree = FakeCuda(), h.sched.tree
    tree.transfer = KVTransfer(tree.pool, tree.host, api=api)
    per_evict, evict = [], tree.evict

    def counted(n: int) -> int:
        before = tree.transfer.backups
        freed = evict(n)
        per_evict.append(tree.transfer.backups - before)
        return freed
    tree.evict = counted
    prompts = {f"w{i}": [60 + i] + list(range(2, 22)) for i in range(12)}
    _drive(h, prompts, api)
    for rid, ids in prompts.items():
        assert h.outs[rid] == expected(ids, 4), rid
    assert api.host_waits == 0
    assert max(per_evict) == 1 and tree.transfer.backups == sum(per_evict)
    assert h.sched.stats()["hicache_demoted_tokens"] > 0

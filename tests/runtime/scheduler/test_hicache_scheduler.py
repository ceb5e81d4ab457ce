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

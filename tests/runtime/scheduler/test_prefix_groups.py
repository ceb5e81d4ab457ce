"""Shared-prefix groups of the decode batch (for cascade attention): which requests share which
cached prefix, as the radix tree says, and the tile tensors handed to the backend. The stand-in
model ignores them, so outputs must stay the reference's."""
from __future__ import annotations

from .standin import expected


def _record_orders(h) -> dict:
    """Request ids of every decode batch, in batch order, keyed by the batch's id."""
    orders, rb = {}, h.sched.running
    real = rb.forward_batch

    def forward_batch(slots):
        batch = real(slots)
        orders[id(batch)] = [r.rid for r in rb.reqs]
        return batch
    rb.forward_batch = forward_batch
    return orders


def _largest_decode(h, orders):
    """The largest decode batch (all requests running together) and its request order."""
    batch = max((b for b in h.runner.forwards if b.mode.is_decode), key=lambda b: b.batch_size)
    return batch, orders[id(batch)]


def test_groups_follow_the_radix_tree(make_harness):
    h = make_harness()
    h.sched.running.prefix_members = 2  # as a backend with 2-request tiles would ask
    orders = _record_orders(h)
    shared = [(i * 7) % 45 + 1 for i in range(40)]
    prompts = {"a": shared + [1, 2], "b": shared + [3, 4, 5], "c": shared + [6],
               "d": [(i * 5) % 40 + 2 for i in range(40)], "e": shared[:10] + [9] * 30}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=6, ignore_eos=True)
    h.run()
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 6)
    batch, order = _largest_decode(h, orders)
    assert batch.batch_size == 5
    sp = batch.shared_prefix
    lens = dict(zip(order, sp.prefix_lens.tolist()))
    assert lens == {"a": 40, "b": 40, "c": 40, "d": 0, "e": 0}  # e shares 10 < 32 tokens
    # three members over 2-request tiles: two tiles of the 40-token group, the rest empty
    assert sp.tile_lens.tolist() == [40, 40]
    members = sorted(m for t in sp.tile_members.tolist() for m in t if m >= 0)
    assert sorted(order[m] for m in members) == ["a", "b", "c"]


def test_nested_prefixes_join_the_deepest_shared_node(make_harness):
    h = make_harness()
    h.sched.running.prefix_members = 4
    orders = _record_orders(h)
    base = [(i * 3) % 45 + 1 for i in range(40)]
    longer = base + [(i * 11) % 45 + 1 for i in range(24)]
    prompts = {"a": base + [7, 7], "b": longer + [1], "c": longer + [2, 2]}
    for rid, p in prompts.items():
        h.submit(rid, p, max_new_tokens=4, ignore_eos=True)
    h.run()
    for rid, p in prompts.items():
        assert h.outs[rid] == expected(p, 4)
    batch, order = _largest_decode(h, orders)
    sp = batch.shared_prefix
    lens = dict(zip(order, sp.prefix_lens.tolist()))
    # b and c share 64 tokens; a would be alone in the 40-token group: no group for it
    assert lens == {"a": 0, "b": 64, "c": 64}
    assert sp.tile_lens.tolist()[0] == 64


def test_no_groups_without_a_shared_prefix(make_harness):
    h = make_harness()
    h.sched.running.prefix_members = 4
    h.submit("x", list(range(1, 41)), max_new_tokens=3, ignore_eos=True)
    h.submit("y", list(range(41, 81)), max_new_tokens=3, ignore_eos=True)
    h.run()
    decodes = [b for b in h.runner.forwards if b.mode.is_decode]
    assert decodes and all(b.shared_prefix is None for b in decodes)


def test_groups_beyond_the_tile_budget_fall_back_to_plain_decode():
    import torch

    from sgdsl.runtime.layers.attention import shared_prefix as sp_mod

    cpu = torch.device("cpu")
    groups = [(r, 40 + r, [2 * r, 2 * r + 1]) for r in range(40)]  # 40 groups of 2, bs 80
    sp = sp_mod.build_shared_prefix(groups, 80, 2, cpu)
    assert sp.tile_lens.shape[0] == sp_mod.MAX_TILES == 32
    kept = [g for g in groups if sp.prefix_lens[g[2][0]] > 0]
    # the longest prefixes (largest savings) got the 32 tiles; the rest read per request
    assert sorted(g[1] for g in kept) == list(range(48, 80))
    assert all(sp.prefix_lens[g[2]].tolist() == [0, 0] for g in groups if g not in kept)
    assert sorted(sp.tile_lens.tolist()) == list(range(48, 80))

"""The hierarchical cache under TP/PP, where every rank runs the same scheduler and must keep an
identical tree (else the ranks' batches differ and their collectives hang or mix requests).
Two ranks' schedulers over the stand-in model, on the CUDA path's stand-in streams, one rank's
copies landing every step and the other's lagging far behind: with lockstep (what a TP/PP
engine's tree gets) they build the same batches and answers; deciding by each rank's own
events instead (the tp_size 1 path) lets the slow rank keep different host copies."""
from __future__ import annotations

import pytest

from sgdsl.runtime.cache.hicache.factory import make_tree
from sgdsl.runtime.cache.hicache.transfer import KVTransfer
from sgdsl.runtime.config import EngineConfig

from .fake_cuda import FakeCuda
from .standin import StandInRunner, expected


def _rank(make_harness, lockstep: bool):
    h = make_harness(96, enable_hierarchical_cache=True, hicache_ratio=2.0)
    api, tree = FakeCuda(), h.sched.tree
    tree.transfer = KVTransfer(tree.pool, tree.host, api=api, lockstep=lockstep)
    return h, api


def _batches(h) -> list[tuple]:
    return [(b.mode.name, tuple(b.extend_seq_lens_cpu or ()), b.batch_size)
            for b in h.runner.forwards]


def _conversations(ranks, paces: tuple[int, int]) -> None:
    """Three turns of eight conversations, the ranks stepped together; rank i's device
    finishes its copies every ``paces[i]`` steps."""
    prompts = {f"c{i}": [60 + i] + list(range(2, 22)) for i in range(8)}
    for turn in range(3):
        for h, _ in ranks:
            for c, p in prompts.items():
                h.submit(f"{c}t{turn}", p, max_new_tokens=4, ignore_eos=True)
        steps, busy = 0, [True]
        while any(busy):
            busy = [h.sched.step() for h, _ in ranks]
            steps += 1
            for (_, api), pace in zip(ranks, paces):
                if steps % pace == 0:
                    api.advance()
        for c, p in prompts.items():
            out = ranks[0][0].outs[f"{c}t{turn}"]
            assert out == expected(p, 4), (c, turn)
            prompts[c] = p + out + [30 + turn]


@pytest.mark.parametrize("slow_pace", [5, 10_000])
def test_ranks_with_different_copy_speeds_keep_one_tree(make_harness, slow_pace):
    ranks = [_rank(make_harness, True), _rank(make_harness, True)]
    _conversations(ranks, (1, slow_pace))
    (a, _), (b, _) = ranks
    assert _batches(a) == _batches(b)
    assert a.outs == b.outs
    hicache = [{k: v for k, v in h.sched.stats().items() if k.startswith("hicache_")
                and "seconds" not in k and "latency" not in k} for h in (a, b)]
    assert hicache[0] == hicache[1]
    assert hicache[0]["hicache_host_evicted_tokens"] > 0  # the host pool was under pressure


def test_without_lockstep_copy_speed_changes_the_tree(make_harness):
    """The same workload decided by each rank's own events: the slow rank's trees differ
    (what lockstep prevents; harmless at tp_size 1, where there is one tree)."""
    ranks = [_rank(make_harness, False), _rank(make_harness, False)]
    _conversations(ranks, (1, 5))
    assert _batches(ranks[0][0]) != _batches(ranks[1][0])


def test_engines_of_several_ranks_get_lockstep_trees():
    runner = StandInRunner(64)
    for tp, pp, want in ((1, 1, False), (2, 1, True), (1, 2, True)):
        config = EngineConfig(enable_hierarchical_cache=True, hicache_ratio=2.0, tp_size=tp,
                              pp_size=pp)
        assert make_tree(runner, config).transfer.lockstep is want

"""The tiered cache with a CUDA device pool (run on the GPU machine): backups and loads on the
side stream, page-locked host rows moved as runs or through staging, keep every token's KV;
the integrity check (which waits for copies in flight) holds after each request."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.cache.hicache import transfer
from sgdsl.runtime.cache.hicache.tree import HiRadixCache
from sgdsl.runtime.cache.host_pool import HostKVPool
from sgdsl.runtime.cache.pool import TokenKVPool

from .test_hicache_tree import _seqs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

LAYERS, HEADS, DIM = 3, 2, 8


def _kv(token: int, pos: int, layer: int) -> float:
    return float((token * 64 + pos) % 2048 + layer)  # exact in bf16 up to 256; fp32 here


def _serve(tree: HiRadixCache, seq: list[int]) -> int:
    pool = tree.pool
    res, host, _ = tree.match_and_load(seq[:-1])
    tree.lock(res.node)
    slots = res.slots.to("cuda")
    for layer in range(LAYERS):
        want = torch.tensor([_kv(t, p, layer) for p, t in enumerate(seq[:res.length])],
                            device="cuda")
        assert torch.equal(pool.k_buffer[layer][slots, 0, 0], want), layer
        assert torch.equal(pool.v_buffer[layer][slots, 1, 3], -want), layer
    n = len(seq) - res.length
    if pool.available() < n:
        tree.evict(n - pool.available())
    new = pool.alloc(n)
    for layer in range(LAYERS):
        vals = torch.tensor([_kv(seq[res.length + j], res.length + j, layer) for j in range(n)],
                            device="cuda")
        pool.k_buffer[layer][new.to("cuda")] = vals.view(-1, 1, 1).expand(n, HEADS, DIM)
        pool.v_buffer[layer][new.to("cuda")] = -vals.view(-1, 1, 1).expand(n, HEADS, DIM)
    tree.cache_finished_req(seq, torch.cat([res.slots, new]), res.node)
    tree.check_integrity(idle=True)
    return host


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("max_runs", [transfer.MAX_RUNS, 0])  # 0: every copy via staging
def test_rounds_through_a_cuda_pool(policy, max_runs, monkeypatch):
    monkeypatch.setattr(transfer, "MAX_RUNS", max_runs)
    pool = TokenKVPool(120, LAYERS, HEADS, DIM, torch.float32, "cuda")
    tree = HiRadixCache(pool, HostKVPool(600, pool, pin_memory=True), policy)
    seqs = _seqs(10, 40, shared=10, seed=3)
    for seq in seqs:
        _serve(tree, seq)
    loaded = sum(_serve(tree, seq) for seq in seqs)
    assert loaded > 200
    assert tree.hicache_stats()["hicache_load_seconds_total"] > 0
    tree.close()

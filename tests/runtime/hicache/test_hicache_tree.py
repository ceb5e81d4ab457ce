"""HiRadixCache in-process (no engine): every tier move keeps each token's KV, the integrity
check holds after each step, storage pages survive a new tree and corrupt pages are skipped."""
from __future__ import annotations

import logging
import random

import pytest
import torch

from sgdsl.runtime.cache.host_pool import HostKVPool
from sgdsl.runtime.cache.hicache.storage import PAGE_TOKENS, FileStorage
from sgdsl.runtime.cache.hicache import transfer
from sgdsl.runtime.cache.hicache.transfer import KVTransfer, pair_runs, runs, split
from sgdsl.runtime.cache.hicache.tree import HiRadixCache
from sgdsl.runtime.cache.pool import TokenKVPool

LAYERS, HEADS, DIM = 2, 1, 4


def _tree(device_slots: int, host_slots: int, policy: str, storage_dir=None) -> HiRadixCache:
    pool = TokenKVPool(device_slots, LAYERS, HEADS, DIM, torch.float32, "cpu")
    host = HostKVPool(host_slots, pool, pin_memory=False)
    storage = None if storage_dir is None else FileStorage(
        storage_dir, "test-layout", 1 << 30, (LAYERS, 2, PAGE_TOKENS, HEADS, DIM), torch.float32)
    return HiRadixCache(pool, host, policy, storage)


def _kv(token: int, pos: int) -> float:
    return float(token * 1000 + pos)


def _serve(tree: HiRadixCache, seq: list[int]) -> tuple[int, int, int]:
    """One request: match (loading lower tiers), check the prefix's KV, 'compute' the rest
    (KV = a function of token and position), cache it. Returns (prefix, host, storage)."""
    pool = tree.pool
    res, host, storage = tree.match_and_load(seq[:-1])
    tree.lock(res.node)
    for pos, slot in enumerate(res.slots.tolist()):
        for layer in range(LAYERS):
            assert pool.k_buffer[layer][slot, 0, 0].item() == _kv(seq[pos], pos) + layer
            assert pool.v_buffer[layer][slot, 0, 0].item() == -_kv(seq[pos], pos)
    n = len(seq) - res.length
    if pool.available() < n:
        tree.evict(n - pool.available())
    new = pool.alloc(n)
    assert new is not None
    for j, slot in enumerate(new.tolist()):
        pos = res.length + j
        for layer in range(LAYERS):
            pool.k_buffer[layer][slot] = _kv(seq[pos], pos) + layer
            pool.v_buffer[layer][slot] = -_kv(seq[pos], pos)
    tree.cache_finished_req(seq, torch.cat([res.slots, new]), res.node)
    tree.check_integrity(idle=True)
    return res.length, host, storage


def _seqs(n: int, length: int, shared: int = 0, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    head = [rng.randrange(50) for _ in range(shared)]
    return [head + [rng.randrange(50) for _ in range(length - shared)] for _ in range(n)]


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_second_round_comes_back_from_host(policy):
    tree = _tree(100, 400, policy)
    seqs = _seqs(10, 30, shared=8)
    for seq in seqs:
        _serve(tree, seq)
    second = [_serve(tree, seq) for seq in seqs]
    assert all(prefix == 29 for prefix, _, _ in second)
    assert sum(host for _, host, _ in second) > 200  # most came back from the host pool
    assert tree.hicache_stats()["hicache_demoted_tokens"] > 0


def test_small_host_pool_drops_and_stays_consistent():
    tree = _tree(60, 70, "write_back")
    for seq in _seqs(20, 25, shared=5, seed=1) * 2:
        _serve(tree, seq)
    stats = tree.hicache_stats()
    assert stats["hicache_host_evicted_tokens"] > 0
    assert tree.reset()
    tree.check_integrity(idle=True)
    assert tree.host.available() == tree.host.size


def test_selective_backs_up_on_second_hit():
    tree = _tree(200, 400, "write_through_selective")
    seq = _seqs(1, 40)[0]
    _serve(tree, seq)
    assert tree.host_size() == 0
    _serve(tree, seq)  # first hit
    assert tree.host_size() == 0
    _serve(tree, seq)  # second hit: copied to the host
    assert tree.host_size() > 0


def test_storage_pages_survive_a_new_tree_and_corrupt_ones_are_skipped(tmp_path, caplog):
    seqs = _seqs(4, 3 * PAGE_TOKENS + 10, seed=2)
    tree = _tree(300, 400, "write_through", tmp_path)
    for seq in seqs:
        _serve(tree, seq)
    tree.close()
    files = sorted(tmp_path.rglob("*.kv"))
    assert len(files) == 4 * 3
    files[0].write_bytes(files[0].read_bytes()[:-7])  # truncated

    tree = _tree(300, 400, "write_through", tmp_path)
    with caplog.at_level(logging.WARNING):
        results = [_serve(tree, seq) for seq in seqs]
    assert "skipping corrupt file" in caplog.text and files[0].name in caplog.text
    assert tree.storage.corrupt == 1
    stored = sorted(storage for _, _, storage in results)  # the bad page ends one prefix
    assert stored[0] < 3 * PAGE_TOKENS and stored[1:] == [3 * PAGE_TOKENS] * 3
    tree.close()


def test_storage_serves_only_the_pages_every_rank_agrees_on(tmp_path, caplog):
    """Lockstep (TP): ``agree`` is the minimum over the ranks of the pages each could read;
    here another rank could read only the first page, so the second is a miss here too (and
    forgotten, so every rank's storage holds the same pages again)."""
    seq = _seqs(1, 3 * PAGE_TOKENS + 10, seed=3)[0]
    tree = _tree(300, 400, "write_through", tmp_path)
    _serve(tree, seq)
    tree.close()
    tree = _tree(300, 400, "write_through", tmp_path)
    asked = []
    tree.agree = lambda n: asked.append(n) or min(n, 1)
    hashes = tree.storage.page_hashes(seq, 3)
    with caplog.at_level(logging.WARNING):
        prefix, host, storage = _serve(tree, seq)  # checks every served token's KV
    assert asked == [3] and (prefix, host, storage) == (PAGE_TOKENS, 0, PAGE_TOKENS)
    second = tree.storage._path(hashes[1]).name
    assert f"skipping page file {second} (not usable on every rank)" in caplog.text
    assert tree.storage.has(hashes[0]) and tree.storage.has(hashes[2])
    assert tree.hicache_stats()["hicache_storage_unshared_pages"] == 1
    tree.storage.flush()  # the served request's write-through stores the page again
    assert tree.storage.has(hashes[1]) and tree.storage.exists(hashes[1])
    tree.close()


def test_storage_budget_keeps_the_most_recent_pages(tmp_path):
    storage = FileStorage(tmp_path, "budget", 1 << 30, (LAYERS, 2, PAGE_TOKENS, HEADS, DIM),
                          torch.float32)
    tokens = list(range(1000, 1000 + 5 * PAGE_TOKENS))  # same digits: same header sizes
    hashes = storage.page_hashes(tokens, 5)
    for p, h in enumerate(hashes):
        storage.put(h, tokens[p * PAGE_TOKENS:(p + 1) * PAGE_TOKENS],
                    torch.full((LAYERS, 2, PAGE_TOKENS, HEADS, DIM), float(p)))
        storage.flush()
        if p == 0:  # every page file has the same size: room for three
            storage.max_bytes = 3 * next(tmp_path.rglob("*.kv")).stat().st_size
    assert [storage.exists(h) for h in hashes] == [False, False, True, True, True]
    rows = storage.get(hashes[4], tokens[4 * PAGE_TOKENS:])
    assert rows is not None and bool((rows == 4.0).all())
    assert storage.get(hashes[3], tokens[:PAGE_TOKENS]) is None  # other tokens: not served
    storage.close()


def test_storage_budget_follows_the_calls_not_the_writer(tmp_path, caplog):
    """The budget is kept in the order of ``put``/``touch`` (what every TP rank does alike),
    whatever the writer thread's pace: with the writer held back, the pages dropped while
    queued are never written; the shard suffix names the files; a header that parses but is
    not an object is a corrupt file, not a crash."""
    import threading

    shape = (LAYERS, 2, PAGE_TOKENS, HEADS, DIM)
    storage = FileStorage(tmp_path, "order", 1 << 30, shape, torch.float32, shard="tp1of2")
    storage.max_bytes = 3 * storage.page_bytes
    gate, write = threading.Event(), storage._write
    storage._write = lambda *item: (gate.wait(30), write(*item))
    tokens = list(range(5 * PAGE_TOKENS))
    hashes = storage.page_hashes(tokens, 5)
    for p, h in enumerate(hashes):
        storage.put(h, tokens[p * PAGE_TOKENS:(p + 1) * PAGE_TOKENS], torch.zeros(shape))
        if p == 2:
            storage.touch(hashes[0])  # used again: the oldest is now page 1
    assert [storage.has(h) for h in hashes] == [True, False, False, True, True]
    gate.set()
    storage.flush()
    assert [storage.exists(h) for h in hashes] == [True, False, False, True, True]
    assert all(f.name.endswith(".tp1of2.kv") for f in tmp_path.rglob("*.kv"))
    path = storage._path(hashes[0])
    path.write_bytes(len(b"[1]").to_bytes(4, "little") + b"[1]")
    with caplog.at_level(logging.WARNING):
        assert storage.read(hashes[0], tokens[:PAGE_TOKENS]) is None
    assert f"skipping corrupt file {path.name} (unreadable header)" in caplog.text
    storage.close()


def test_host_slots_move_as_contiguous_runs():
    assert runs(torch.tensor([4, 5, 6, 9, 10, 2])) == [(0, 4, 3), (3, 9, 2), (5, 2, 1)]
    assert runs(torch.empty(0, dtype=torch.int64)) == []
    pool = TokenKVPool(8, 1, 1, 1, torch.float32, "cpu")
    host = HostKVPool(16, pool, pin_memory=False)
    a, _, c = host.alloc(4), host.alloc(4), host.alloc(4)  # 12..15, 8..11, 4..7
    for part in (a[:2], c[:2], a[2:], c[2:]):  # freed piecemeal: the list interleaves them
        host.free(part)
    host.defragment()
    assert runs(host.alloc(4)) == [(0, 12, 4)]
    host.check_integrity()


def test_pair_runs_cut_where_either_side_jumps():
    a, b = torch.tensor([4, 5, 6, 7, 9, 10]), torch.tensor([20, 21, 30, 31, 32, 33])
    assert pair_runs(a, b) == [(0, 4, 20, 2), (2, 6, 30, 2), (4, 9, 32, 2)]
    assert pair_runs(b, a) == [(0, 20, 4, 2), (2, 30, 6, 2), (4, 32, 9, 2)]
    empty = torch.empty(0, dtype=torch.int64)
    assert pair_runs(empty, empty) == []


def test_split_copies_long_stretches_and_gathers_the_rest():
    src = torch.tensor([0, 1, 2, 3, 8, 20, 21, 22, 5])
    dst = torch.tensor([50, 51, 52, 53, 60, 70, 71, 72, 9])
    direct, rest_src, rest_dst = split(src, dst, 3)
    assert direct == [(0, 50, 4), (20, 70, 3)]
    assert rest_src.tolist() == [8, 5] and rest_dst.tolist() == [60, 9]
    direct, rest_src, _ = split(src, dst, 1)
    assert len(direct) == 4 and rest_src.numel() == 0
    direct, rest_src, rest_dst = split(src, dst, None)  # off: everything gathers
    assert direct == [] and rest_src is src and rest_dst is dst


def test_cuda_plan_splits_only_when_it_takes_no_more_copies(monkeypatch):
    """The plan a CUDA pool gets (only the plan: no copy runs): pool to pool where that is no
    more copies per layer than gathering every token."""
    dev = TokenKVPool(300, 1, 1, 1, torch.float32, "cpu")
    moves = KVTransfer(dev, HostKVPool(600, dev, pin_memory=False))
    moves.cuda = True
    monkeypatch.setattr(transfer, "MIN_DIRECT_TOKENS", 16)
    two = torch.cat([torch.arange(0, 32), torch.arange(50, 82)])
    host = torch.cat([torch.arange(100, 132), torch.arange(200, 232)])
    direct, rest_dev, _ = moves._plan(two, host)  # 2 copies vs 2 runs + the scatter
    assert direct == [(0, 100, 32), (50, 200, 32)] and rest_dev.numel() == 0
    strided = torch.cat([torch.arange(0, 32), torch.tensor([40, 42, 44])])  # + an answer
    direct, rest_dev, rest_host = moves._plan(strided, torch.arange(100, 135))
    assert direct == [] and rest_dev.tolist() == strided.tolist()  # 1 + 1 + 1 > 1 + 1
    assert rest_host.tolist() == list(range(100, 135))
    assert moves.direct_moves == 1


# direct: every stretch pool to pool; mixed: 1- and 2-token stretches gathered (as the CPU and
# CUDA do below MIN_DIRECT_TOKENS*, 16 tokens: the tests' moves are shorter); gathered:
# SGDSL_HICACHE_DIRECT=0
COPY_PATHS = {"direct": {"MIN_DIRECT_TOKENS_CPU": 1}, "mixed": {"MIN_DIRECT_TOKENS_CPU": 3},
              "gathered": {"DIRECT": False}}


@pytest.mark.parametrize("path", list(COPY_PATHS))
def test_backup_and_load_keep_rows_in_every_copy_path(path, monkeypatch):
    for name, value in COPY_PATHS[path].items():
        monkeypatch.setattr(transfer, name, value)
    dev = TokenKVPool(64, 2, 2, 4, torch.float32, "cpu")
    host = HostKVPool(128, dev, pin_memory=False)
    moves = KVTransfer(dev, host)
    for layer in range(2):  # every row, layer, K and V distinct
        rows = torch.arange(65 * 8, dtype=torch.float32).view(65, 2, 4) + 1000 * layer
        dev.k_buffer[layer].copy_(rows)
        dev.v_buffer[layer].copy_(-rows)
    src = torch.tensor([3, 4, 5, 10, 11, 40, 2, 7])  # runs on one side, not the other
    held = torch.tensor([100, 101, 102, 103, 5, 6, 7, 50])
    landed = []
    assert moves.backup(src, held, lambda: landed.append(True)) is None and landed
    for layer in range(2):
        assert torch.equal(host.k_buffer[layer][held], dev.k_buffer[layer][src])
        assert torch.equal(host.v_buffer[layer][held], dev.v_buffer[layer][src])
    back = torch.tensor([20, 21, 22, 23, 24, 25, 26, 60])
    assert moves.load(held, back, []) is None  # the CPU copies at once
    for layer in range(2):
        assert torch.equal(dev.k_buffer[layer][back], dev.k_buffer[layer][src])
        assert torch.equal(dev.v_buffer[layer][back], dev.v_buffer[layer][src])
    assert moves.direct_moves == (0 if path == "gathered" else 2)


class _Event:
    """A stand-in CUDA event: ``fired`` says whether its copy has landed."""

    def __init__(self, name: str, fired: bool = False) -> None:
        self.name, self.fired = name, fired

    def query(self) -> bool:
        return self.fired


def test_attention_waits_for_each_layer_of_each_pending_load(monkeypatch):
    """The bookkeeping of layer-wise overlap (``TokenKVPool.await_layers``/``wait_layer``),
    with stand-in events: layer i waits for layer i of every load queued since, once; loads
    that have landed are dropped; a pool with no load pending waits for nothing."""
    waited: list[str] = []

    class _Stream:
        def wait_event(self, event: _Event) -> None:
            waited.append(event.name)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    pool = TokenKVPool(8, 3, 1, 1, torch.float32, "cpu")
    pool.wait_layer(0)
    assert waited == [] and pool._layer_events is None
    landed = [_Event(f"old{i}", fired=True) for i in range(3)]
    pool.await_layers(landed)
    pool.await_layers([_Event(f"a{i}") for i in range(3)])  # drops the landed load
    pool.await_layers([_Event(f"b{i}") for i in range(3)])
    assert len(pool._layer_events) == 2
    for layer in range(3):
        pool.wait_layer(layer)
    assert waited == ["a0", "b0", "a1", "b1", "a2", "b2"]
    assert pool._layer_events is None  # the prefill's last layer waited for everything
    pool.wait_layer(1)  # a later forward (a decode step): nothing to wait for
    assert len(waited) == 6


def test_freeing_device_slots_fences_on_their_copies(monkeypatch):
    """Before a node's device slots go back to the pool, the compute stream is fenced on the
    copies that may still touch them (its load; its backup's gather while pending), and only
    those (the CUDA branch, with stand-in events)."""
    tree = _tree(60, 200, "write_through")
    a, b = _seqs(2, 40, seed=4)
    _serve(tree, a)
    node = tree.match_prefix(a).node
    node.load_event = _Event("load of a")
    fenced: list = []
    monkeypatch.setattr(tree.transfer, "cuda", True)
    monkeypatch.setattr(tree.transfer, "fence", lambda e: fenced.append(e and e.name))
    tree.evict(40)
    assert "load of a" in fenced and node.load_event is None
    monkeypatch.setattr(tree.transfer, "cuda", False)
    _serve(tree, b)
    tree.check_integrity(idle=True)

"""The tiered cache with a CUDA device pool (run on the GPU machine): backups and loads on the
side stream, page-locked host rows moved by the KV move kernel (over UVA) or as runs or
through staging (the plain copies), keep every token's KV; the integrity check (which waits
for copies in flight) holds after each request."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.cache.hicache import transfer
from sgdsl.runtime.cache.hicache.transfer import KVTransfer
from sgdsl.runtime.cache.hicache.tree import HiRadixCache
from sgdsl.runtime.cache.host_pool import SMALL_PIN_BYTES, HostKVPool
from sgdsl.runtime.cache.pool import TokenKVPool, _raw

from .test_hicache_tree import _seqs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

LAYERS, HEADS, DIM = 3, 2, 8


def _kv(token: int, pos: int, layer: int) -> float:
    return float((token * 64 + pos) % 2048 + layer)  # exact in bf16 up to 256; fp32 here


def _serve(tree: HiRadixCache, seq: list[int], check: bool = True) -> int:
    """One request: match (loading lower tiers), check the prefix's KV, write the rest, cache
    it. ``check=False``: no integrity check after (it waits for copies in flight)."""
    pool = tree.pool
    res, host, _ = tree.match_and_load(seq[:-1])
    tree.lock(res.node)
    slots = res.slots.to("cuda")
    for layer in range(LAYERS):
        pool.wait_layer(layer)  # as attention does before reading the layer
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
    tree.issue_backups()  # as the scheduler does once a step was launched
    if check:
        tree.check_integrity(idle=True)
    return host


# kernel: the KV move kernel (the default on CUDA); the others are the plain copies
# (hicache_io_backend="direct"): default: stretches of 16+ tokens pool to pool, the rest gathered
# (where that is no more copies); least-1: stretches of any length; runs: host runs gathered
# and scattered (SGDSL_HICACHE_DIRECT=0); staging: through pinned staging; default+staging: the
# gathered rest through staging
CUDA_PATHS = {"kernel": {}, "default": {}, "least-1": {"MIN_DIRECT_TOKENS": 1},
              "runs": {"DIRECT": False}, "staging": {"DIRECT": False, "MAX_RUNS": 0},
              "default+staging": {"MAX_RUNS": 0}}


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("path", list(CUDA_PATHS))
def test_rounds_through_a_cuda_pool(policy, path, monkeypatch):
    for name, value in CUDA_PATHS[path].items():
        monkeypatch.setattr(transfer, name, value)
    pool = TokenKVPool(120, LAYERS, HEADS, DIM, torch.float32, "cuda")
    tree = HiRadixCache(pool, HostKVPool(600, pool, pin_memory=True), policy,
                        io_backend="kernel" if path == "kernel" else "direct")
    assert (tree.transfer.io is not None) == (path == "kernel")
    seqs = _seqs(10, 40, shared=10, seed=3)
    for seq in seqs:
        _serve(tree, seq)
    loaded = sum(_serve(tree, seq) for seq in seqs)
    assert loaded > 200
    stats = tree.hicache_stats()
    assert stats["hicache_load_seconds_total"] > 0
    assert stats["hicache_io_kernel"] == (path == "kernel")
    # plain copies: a fresh prefill's slots run in both pools: its write-through goes pool to
    # pool (the kernel moves every row itself)
    assert (stats["hicache_direct_moves_total"] > 0) == (
        path != "kernel" and "DIRECT" not in CUDA_PATHS[path])
    tree.close()


# -- layer-wise overlap: the load stream, per-layer events, the waits ------------------------
SLEEP = 1_000_000_000  # GPU clock cycles (~0.5 s): holds a side stream back


def _parked(policy: str = "write_through") -> tuple[HiRadixCache, list[int], list[int]]:
    """A 40-slot device pool where ``a`` went to the host (``b`` pushed it out)."""
    pool = TokenKVPool(40, LAYERS, HEADS, DIM, torch.float32, "cuda")
    tree = HiRadixCache(pool, HostKVPool(400, pool, pin_memory=True), policy)
    a, b = _two(seed=5)
    _serve(tree, a)
    _serve(tree, b)
    assert tree.match_prefix(a[:-1]).host_length == 29
    torch.cuda.synchronize()
    return tree, a, b


def _two(seed: int) -> list[list[int]]:
    """Two 30-token requests that share no prefix (distinct first tokens)."""
    return [[first, *seq[1:]] for first, seq in zip((51, 52), _seqs(2, 30, seed=seed))]


def _hold_load_stream(tree: HiRadixCache) -> None:
    for stream in tree.transfer.load_streams:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(SLEEP)


def test_load_gives_attention_one_event_per_layer():
    tree, a, _ = _parked()
    pool = tree.pool
    _hold_load_stream(tree)
    res, host, _ = tree.match_and_load(a[:-1])
    assert host == 29 and res.length == 29
    assert pool._layer_events is not None and len(pool._layer_events) == 1
    events = pool._layer_events[0]
    assert len(events) == LAYERS and all(e is not None for e in events)
    slots = res.slots.to("cuda")
    reads = []
    for layer in range(LAYERS):  # what attention does: wait for this layer, then read it
        pool.wait_layer(layer)
        assert events[layer] is None
        reads.append(pool.k_buffer[layer][slots, 0, 0].clone())
    assert pool._layer_events is None  # every layer waited for: nothing left pending
    torch.cuda.synchronize()
    for layer, got in enumerate(reads):  # without the waits these would be stale rows
        want = torch.tensor([_kv(t, p, layer) for p, t in enumerate(a[:29])], device="cuda")
        assert torch.equal(got, want), layer
    tree.check_integrity(idle=True)
    tree.close()


def test_compute_stream_runs_ahead_of_a_load_until_attention_needs_it():
    tree, a, _ = _parked()
    pool = tree.pool
    _hold_load_stream(tree)
    tree.match_and_load(a[:-1])
    events = list(pool._layer_events[0])
    # work that reads no loaded slot (another request's rows, a decode step) is not held back
    other = pool.k_buffer[0][1:4].clone()
    before = torch.cuda.Event()
    before.record()
    before.synchronize()
    assert not events[0].query(), "the compute stream waited for a load nobody read yet"
    pool.wait_layer(0)  # the prefill's first layer: from here on it waits for layer 0 only
    after = torch.cuda.Event()
    after.record()
    after.synchronize()
    assert events[0].query()
    assert other.shape[0] == 3
    torch.cuda.synchronize()
    tree.check_integrity(idle=True)
    tree.close()


def test_a_registered_host_pool_is_pinned_and_its_copies_never_block_the_host():
    """A host pool past SMALL_PIN_BYTES is page-locked in place (cudaHostRegister, as every
    real pool is): the runtime must see it as pinned, or each copy would be a pageable one,
    which holds the host until the stream reaches it. With the side streams held, a backup
    and a load are only queued: neither has landed when the call returns."""
    pool = TokenKVPool(40, LAYERS, HEADS, DIM, torch.float32, "cuda")
    host = HostKVPool(200_000, pool, pin_memory=True)
    assert host._store.nbytes >= SMALL_PIN_BYTES and host.pinned
    tree = HiRadixCache(pool, host, "write_through")
    assert tree.transfer.io is not None  # the launcher took the registered pool's pointer
    a, b = _two(seed=7)
    with torch.cuda.stream(tree.transfer.write_stream):
        torch.cuda._sleep(SLEEP)
    _serve(tree, a, check=False)  # its write-through backup is queued behind the sleep
    assert tree.transfer.pending and not tree.transfer.pending[-1].event.query()
    torch.cuda.synchronize()
    _serve(tree, b)  # pushes a out to the host
    torch.cuda.synchronize()
    _hold_load_stream(tree)
    res, loaded, _ = tree.match_and_load(a[:-1])
    assert loaded == 29 and not pool._layer_events[0][0].query()  # queued, not copied yet
    slots = res.slots.to("cuda")
    for layer in range(LAYERS):
        pool.wait_layer(layer)
        want = torch.tensor([_kv(t, p, layer) for p, t in enumerate(a[:29])], device="cuda")
        assert torch.equal(pool.k_buffer[layer][slots, 0, 0], want), layer
    tree.check_integrity(idle=True)
    tree.close()


def test_misses_never_make_the_host_wait(monkeypatch):
    """Distinct prompts through a CUDA pool they overflow (write-through, each backup issued
    as the scheduler issues them, demotions while copies may be in flight, the host pool
    evicting in turn): no event or stream ``synchronize`` (each would hold the scheduler
    thread until the device got there)."""
    waits: list[str] = []
    for cls in (torch.cuda.Event, torch.cuda.Stream):
        sync = cls.synchronize
        monkeypatch.setattr(cls, "synchronize", lambda self, _sync=sync: (
            waits.append(type(self).__name__), _sync(self))[1])
    pool = TokenKVPool(120, LAYERS, HEADS, DIM, torch.float32, "cuda")
    tree = HiRadixCache(pool, HostKVPool(300, pool, pin_memory=True), "write_through")
    for i, seq in enumerate(_seqs(16, 40, seed=9)):
        _serve(tree, [60 + i, *seq[1:]], check=False)
    assert waits == []
    stats = tree.hicache_stats()
    assert stats["hicache_demoted_tokens"] > 0 and stats["hicache_host_evicted_tokens"] > 0
    tree.check_integrity(idle=True)
    tree.close()


def test_freeing_a_loaded_node_waits_for_its_load():
    tree, a, _ = _parked()
    pool = tree.pool
    _hold_load_stream(tree)
    res, _, _ = tree.match_and_load(a[:-1])
    slots = res.slots.to("cuda")
    pool._layer_events = None  # nobody will read the load (its request was not admitted)
    assert tree.evict(29) >= 29 and tree.match_prefix(a[:-1]).length == 0  # demoted again
    new = pool.alloc(pool.available())
    assert bool(torch.isin(res.slots, new).all())
    for layer in range(LAYERS):  # the slots' next owner writes them on the compute stream
        pool.k_buffer[layer][slots] = 777.0
    torch.cuda.synchronize()
    for layer in range(LAYERS):  # ... after the late load, not before it (else: overwritten)
        assert bool((pool.k_buffer[layer][slots] == 777.0).all()), layer
    pool.free(new)
    tree.check_integrity(idle=True)
    tree.close()


@pytest.mark.parametrize("staged_load", [False, True])
def test_load_after_pending_backup_is_ordered_on_the_device(staged_load, monkeypatch):
    """A node demoted while its backup is still in flight loads back after it: the load's
    stream waits for the backup's event (the host does not), or, when the load gathers its
    rows on the CPU (fragmented host slots: staging), the host waits for the backup first."""
    pool = TokenKVPool(40, LAYERS, HEADS, DIM, torch.float32, "cuda")
    tree = HiRadixCache(pool, HostKVPool(400, pool, pin_memory=True), "write_through")
    a, b = _two(seed=6)
    with torch.cuda.stream(tree.transfer.write_stream):
        torch.cuda._sleep(SLEEP)  # a's backup stays pending
    _serve(tree, a, check=False)
    _serve(tree, b, check=False)  # demotes a while its backup may be in flight
    if staged_load:
        tree.transfer.io = None  # the plain copies' staged load
        monkeypatch.setattr(transfer, "DIRECT", False)
        monkeypatch.setattr(transfer, "MAX_RUNS", 0)
    assert _serve(tree, a) == 29  # loads it back; the values are checked on the device
    tree.check_integrity(idle=True)
    tree.close()


# -- the KV move kernel against the plain copies: scattered slots, model-sized rows ----------
def _random_pools(dtype: torch.dtype, host_slots: int, seed: int
                  ) -> tuple[TokenKVPool, HostKVPool]:
    """A Llama-8B-shaped device pool (8 KV heads x 128: 2 KiB bf16 rows, 1 KiB fp8) of random
    bytes, and a page-locked host pool (cudaHostRegister'ed past SMALL_PIN_BYTES)."""
    dev = TokenKVPool(4000, 4, 8, 128, dtype, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for buf in (*dev.k_buffer, *dev.v_buffer):
        raw = _raw(buf).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, device="cuda",
                                generator=gen))
    return dev, HostKVPool(host_slots, dev, pin_memory=True)


def _b(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes (random bytes hold NaNs: compare bytes, not values)."""
    return _raw(t).contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("host_slots", [3500, 20_000])  # torch-pinned, registered
@pytest.mark.parametrize("lockstep", [False, True])
def test_kernel_round_trip_equals_the_plain_copies(dtype, host_slots, lockstep):
    """Backups of scattered device slots to scattered host slots, then loads back into other
    scattered device slots: through the kernel and through the plain copies (a twin pair of
    pools), every row equal, equal to the rows first backed up, and the host rows no move
    wrote still zero."""
    gen = torch.Generator().manual_seed(11)
    n = 1500
    src = torch.randperm(4000, generator=gen)[:n] + 1
    held = torch.randperm(host_slots, generator=gen)[:n]
    back = torch.randperm(4000, generator=gen)[:n] + 1
    pairs = []
    for io in (True, False):
        dev, host = _random_pools(dtype, host_slots, seed=5)
        moves = KVTransfer(dev, host, lockstep=lockstep)
        assert moves.io is not None and moves.stats()["hicache_io_kernel"] == 1
        if not io:
            moves.io = None
        pairs.append((dev, host, moves))
    dev = pairs[0][0]
    want = [(_b(dev.k_buffer[layer][src.cuda()]), _b(dev.v_buffer[layer][src.cuda()]))
            for layer in range(4)]
    for dev, host, moves in pairs:
        backups = [moves.backup(src[:n // 2], held[:n // 2], lambda: None),
                   moves.backup(src[n // 2:], held[n // 2:], lambda: None)]
        for _ in range(3):
            moves.tick()
        moves.poll()  # lockstep: landed by now (two ticks)
        if any(b.staging is not None and not b.landed for b in backups):
            moves.finish()  # as the tree does: staged rows reach the host pool on the host
        moves.load(held, back, [b.event for b in backups if not b.landed])
        moves.finish()
        torch.cuda.synchronize()
    (dk, hk, _), (dp, hp, _) = pairs
    assert torch.equal(_b(hk._store), _b(hp._store))
    for layer in range(4):
        for a, b in ((dk.k_buffer[layer], dp.k_buffer[layer]),
                     (dk.v_buffer[layer], dp.v_buffer[layer])):
            assert torch.equal(_b(a), _b(b)), layer
        assert torch.equal(_b(dk.k_buffer[layer][back.cuda()]), want[layer][0]), layer
        assert torch.equal(_b(dk.v_buffer[layer][back.cuda()]), want[layer][1]), layer
    written = torch.zeros(host_slots, dtype=torch.bool)
    written[held] = True
    assert not _b(hk._store[:, :, ~written]).any()


def test_kernel_load_events_per_layer_and_issue_is_a_few_launches(monkeypatch):
    """A kernel load queues one move launch per layer (an event after each, handed to the
    device pool) and a backup one launch, whatever the host slots' runs (all scattered)."""
    from sgdsl.runtime.kernels import kv_move

    launches: list[tuple[int, int]] = []
    real = kv_move.move_rows
    monkeypatch.setattr(kv_move, "move_rows", lambda *a, **k: (launches.append(a[4]),
                                                                real(*a, **k))[1])
    dev, host = _random_pools(torch.bfloat16, 3500, seed=6)
    moves = KVTransfer(dev, host)
    launches.clear()  # the probe's
    slots = torch.randperm(4000)[:500] + 1
    held = torch.randperm(3500)[:500]
    moves.backup(slots, held, lambda: None)
    assert launches == [(0, 8)]
    launches.clear()
    moves.load(held, slots, [moves.pending[-1].event])
    assert launches == [(2 * layer, 2 * layer + 2) for layer in range(4)]
    assert len(dev._layer_events[-1]) == 4
    moves.finish()
    torch.cuda.synchronize()


def test_unpinned_host_pool_keeps_the_plain_copies():
    dev = TokenKVPool(40, LAYERS, HEADS, DIM, torch.float32, "cuda")
    moves = KVTransfer(dev, HostKVPool(100, dev, pin_memory=False))
    assert moves.io is None and moves.stats()["hicache_io_kernel"] == 0


# -- end to end on the GPU: the model's attention (triton) waits per layer for its loads -----
@pytest.fixture(scope="module")
def gpu_rounds(tiny_model_dir):
    """Both rounds of the CPU engine test's workload, without and with the host tier (fp32,
    one request at a time), and round 2 once more with the tiered engine as one batch (one
    forward, several loads in flight)."""
    from sgdsl.runtime import Engine

    from .test_hicache_engine import GEN, POOL, ROUND1, ROUND2, _run

    outs = {}
    for name, extra in (("radix", {}), ("tiered", dict(enable_hierarchical_cache=True,
                                                       hicache_ratio=8))):
        engine = Engine(str(tiny_model_dir), load_format="dummy", device="cuda",
                        dtype="float32", max_total_tokens=POOL, max_running_requests=8,
                        grammar_backend="none", cuda_graph_max_bs=8, **extra)
        try:
            outs[name] = [_run(engine, ROUND1), _run(engine, ROUND2)]
            if name == "tiered":
                outs["batched"] = engine.generate(input_ids=ROUND2, sampling_params=GEN)
            engine.check_idle_integrity()
            outs[name + "_stats"] = engine.stats()
        finally:
            engine.shutdown()
    return outs


def test_gpu_engine_loads_back_with_the_same_outputs(gpu_rounds):
    from .test_hicache_engine import _hit

    radix, tiered = gpu_rounds["radix"], gpu_rounds["tiered"]
    for rnd in range(2):
        assert [o["output_ids"] for o in tiered[rnd]] == [o["output_ids"] for o in radix[rnd]]
    assert _hit(tiered[1]) >= 0.8
    stats = gpu_rounds["tiered_stats"]
    assert stats["hicache_host_hit_tokens"] > 0 and stats["hicache_bytes_host_to_device"] > 0
    assert [o["output_ids"] for o in gpu_rounds["batched"]] == [
        o["output_ids"] for o in radix[1]]

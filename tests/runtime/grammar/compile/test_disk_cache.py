"""The on-disk cache of compiled grammars (runtime/grammar/compile/disk_cache.py): a second compiler on
the same folder compiles nothing and its grammars behave as freshly compiled ones; corrupted
files are ignored (logged) and rewritten; the folder keeps its byte budget (least recently
used first); failures are not stored; a folder others may write is refused."""
from __future__ import annotations

import functools
import json
import logging
import os
import time

import pytest

from sgdsl.runtime.grammar import GrammarCompiler, GrammarKey, allocate_bitmask
from sgdsl.runtime.grammar.compile.cache_identity import cache_identity
from sgdsl.runtime.grammar.compile.disk_cache import GrammarDiskCache
from sgdsl.runtime.layers.bitmask import unpack_bitmask

from ..helpers import VOCAB

KEYS = [GrammarKey("json_schema", json.dumps({
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                             "age": {"type": "integer"}},
            "required": ["name", "age"]})),
        GrammarKey("regex", r"(yes|no)[0-9]{2}"),
        GrammarKey("choices", json.dumps(["red", "green", "blue"]))]


def _disk(backend, root, max_bytes: int = 1 << 30) -> GrammarDiskCache:
    return GrammarDiskCache(root, backend.name, functools.partial(cache_identity, backend.spec),
                            max_bytes)


def _walk(grammar, steps: int = 12) -> list:
    """The grammar's bitmask rows, jump-forward texts and completion along a walk taking the
    highest allowed token each step (its observable behavior on that path)."""
    seen = []
    for _ in range(steps):
        if grammar.is_terminated():
            break
        mask = allocate_bitmask(1, VOCAB)
        grammar.fill_bitmask(mask, 0)
        allowed = unpack_bitmask(mask, VOCAB)[0].nonzero().flatten().tolist()
        seen.append((allowed, grammar.jump_forward_string(), grammar.is_completed()))
        if not allowed:
            break
        assert grammar.accept_token(allowed[-1])
    return seen


def test_second_compiler_compiles_nothing(backend, tmp_path, monkeypatch):
    """Nothing in a worker, nor here: xgrammar's files hold the serialized grammar (pinned:
    the worker otherwise ships it only where that is cheaper than compiling again)."""
    from sgdsl.runtime.grammar.backends.xgrammar_transfer import SHIP_ENV

    monkeypatch.setenv(SHIP_ENV, "compiled")
    first = GrammarCompiler(backend, timeout_s=120, disk=_disk(backend, tmp_path))
    try:
        fresh = {k: _walk(first.compile(k)) for k in KEYS}
        assert first.pool.stats.compiles == len(KEYS)
        # xgrammar's serialized form is written after the request was served: shutdown would
        # cut it short (the source is written then)
        deadline = time.monotonic() + 120
        while first.disk.cache.stats.writes < len(KEYS) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        first.shutdown()  # writes queued on the loader are done when it returns
    assert first.disk.cache.stats.writes == len(KEYS)
    assert len(list((tmp_path / backend.name).glob("*.grammar"))) == len(KEYS)
    second = GrammarCompiler(backend, timeout_s=120, disk=_disk(backend, tmp_path))
    if backend.name == "xgrammar":
        def no_compile(*args):
            raise AssertionError(f"compiled {args} in the engine's process")
        monkeypatch.setattr(backend, "_call", no_compile)
    try:
        for key in KEYS:
            assert _walk(second.compile(key)) == fresh[key]
        assert second.pool.stats.compiles == 0
        assert second.disk.cache.stats.hits == len(KEYS)
    finally:
        second.shutdown()


def test_corrupted_file_is_ignored_and_rewritten(backends, tmp_path, caplog):
    backend = backends["xgrammar"]
    key = KEYS[1]
    c = GrammarCompiler(backend, timeout_s=120, disk=_disk(backend, tmp_path))
    c.compile(key)
    c.shutdown()
    path = c.disk.cache.path(key)
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    c = GrammarCompiler(backend, timeout_s=120, disk=_disk(backend, tmp_path))
    with caplog.at_level(logging.WARNING, logger="sgdsl.runtime.grammar.compile.disk_cache"):
        c.compile(key)
        compiles = c.pool.stats.compiles
        c.shutdown()
    assert c.disk.cache.stats.errors == 1 and compiles == 1
    assert f"ignoring {path}: checksum mismatch" in caplog.text
    assert path.read_bytes() == good  # recompiled and written again


@pytest.mark.parametrize("damage, why", [
    (lambda d: d[:-7], "truncated"), (lambda d: d[:50], "truncated"), (lambda d: b"", "truncated"),
    (lambda d: b"junk" + d[4:], "bad magic"), (lambda d: d[:-1] + b"?", "checksum mismatch")])
def test_damaged_files_are_misses(tmp_path, caplog, damage, why):
    cache = GrammarDiskCache(tmp_path, "xgrammar", "id")
    cache.store(KEYS[0], b"payload" * 10)
    cache.path(KEYS[0]).write_bytes(damage(cache.path(KEYS[0]).read_bytes()))
    with caplog.at_level(logging.WARNING, logger="sgdsl.runtime.grammar.compile.disk_cache"):
        assert cache.load(KEYS[0]) is None
    assert cache.stats.errors == 1 and why in caplog.text
    other = cache.path(KEYS[1])  # a file renamed to another key's name
    os.replace(cache.path(KEYS[0]), other)
    cache.store(KEYS[0], b"payload")
    os.replace(cache.path(KEYS[0]), other)
    assert cache.load(KEYS[1]) is None and "holds another constraint" in caplog.text


def test_failures_are_not_stored(backends, tmp_path):
    backend = backends["xgrammar"]
    c = GrammarCompiler(backend, timeout_s=120, disk=_disk(backend, tmp_path))
    try:
        with pytest.raises(Exception, match="regex"):
            c.compile(GrammarKey("regex", "(unclosed"))
    finally:
        c.shutdown()
    assert c.disk.cache.stats.writes == 0
    assert not list((tmp_path / backend.name).glob("*.grammar"))


def test_budget_evicts_least_recently_used(tmp_path):
    cache = GrammarDiskCache(tmp_path, "xgrammar", "id", max_bytes=10_000)
    keys = [GrammarKey("regex", f"k{i}") for i in range(5)]
    for i, key in enumerate(keys[:4]):  # 2480 bytes a file with its header: 9920 in all
        cache.store(key, bytes([i]) * 2400)
        os.utime(cache.path(key), (1000 + i, 1000 + i))  # a clock the test controls
    assert cache.load(keys[0]) == bytes([0]) * 2400  # read: now the most recently used
    cache.store(keys[4], b"4" * 2400)  # past 10 kB: the least recently used go, to <= 8 kB
    left = {k.text for k in keys if cache.path(k).exists()}
    assert left == {"k0", "k3", "k4"} and cache.stats.evictions == 2
    assert cache.load(keys[1]) is None and cache.stats.misses == 1
    assert cache.evict() == 3 * 2480  # a recount finds what is left


def test_identity_separates_tokenizers_and_backends(backends, tmp_path):
    x, o = backends["xgrammar"], backends["outlines"]
    key = KEYS[1]
    assert _disk(x, tmp_path).path(key) != _disk(o, tmp_path).path(key)
    other = _disk(x, tmp_path)
    other._identity = functools.partial(cache_identity, x.spec.__class__(
        x.spec.name, x.spec.tokenizer, x.spec.vocab_size + 1, x.spec.eos_token_ids))
    assert other.path(key) != _disk(x, tmp_path).path(key)


def test_folder_writable_by_others_is_refused(tmp_path, caplog):
    root = tmp_path / "shared"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    cache = GrammarDiskCache(root, "xgrammar", "id")
    with caplog.at_level(logging.WARNING, logger="sgdsl.runtime.grammar.compile.disk_cache"):
        cache.store(KEYS[1], b"payload")
    assert cache.disabled and "writable by group or others" in caplog.text
    assert cache.load(KEYS[1]) is None and not list(root.rglob("*.grammar"))


def test_new_folder_is_private(tmp_path):
    cache = GrammarDiskCache(tmp_path / "a" / "b", "outlines", "id")
    cache.store(KEYS[1], b"payload")
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700
    assert cache.load(KEYS[1]) == b"payload"


def test_estimate_worker_reads_the_disk_cache(backends, tokenizer, tmp_path):
    """The completion-estimate worker's own copy of a grammar comes from the disk cache (a
    restarted engine compiles nothing there either); the cache travels pickled, as in
    EstimateInit's handshake."""
    import pickle

    from sgdsl.runtime.grammar.forcing.estimate_worker import EstimateInit, _Estimator

    from ..helpers import EOS

    backend = backends["xgrammar"]
    disk = _disk(backend, tmp_path)
    disk.store(KEYS[0], backend.serialize(backend.compile(KEYS[0])))
    init = pickle.loads(pickle.dumps(EstimateInit(backend.spec, tokenizer, VOCAB, (EOS,), 256,
                                                  0.5, disk)))
    estimator = _Estimator(init)

    def no_compile(key):
        raise AssertionError(f"compiled {key}")
    estimator.backend.compile = no_compile
    estimator.add(0, KEYS[0])
    job_id, found, reason = estimator.run(7, 0, [], False)
    assert (job_id, reason) == (7, None) and found  # a shortest completion from the start
    assert estimator.disk.stats.hits == 1


def test_cached_keys_do_not_wait_for_busy_workers(tmp_path):
    """A key on disk is loaded by the loader's thread, never queued behind compiles: with the
    only worker busy for a minute, it is ready at once (and the compile queue never saw it)."""
    from sgdsl.runtime.grammar.compile.pool_limits import PoolLimits

    from ..scripted_backend import ScriptedBackend

    backend = ScriptedBackend()
    disk = GrammarDiskCache(tmp_path, backend.name, "scripted-id")
    disk.store(GrammarKey("regex", "cached"), backend.serialize("compiled:cached"))
    c = GrammarCompiler(backend, timeout_s=120, pool=PoolLimits(workers=1), disk=disk)
    try:
        c.compile(GrammarKey("regex", "warm-up"))  # the worker is up
        slow = c.submit(GrammarKey("regex", "sleep:60"))
        assert c.compile(GrammarKey("regex", "cached")) == "compiled:cached"
        assert not slow.ready() and c.pool.stats.compiles == 1  # only the warm-up compiled
        assert c.disk.cache.stats.hits == 1
    finally:
        c.shutdown()


def test_other_replicas_files_are_found(backends, tmp_path, monkeypatch):
    """Two compilers on one folder (two replicas): a key one compiled is loaded by the other
    once it rescans (a miss asks for a rescan at most every RESCAN_S)."""
    from sgdsl.runtime.grammar.compile import disk_loader

    monkeypatch.setattr(disk_loader, "RESCAN_S", 0.0)
    backend = backends["xgrammar"]
    a = GrammarCompiler(backend, timeout_s=120, disk=_disk(backend, tmp_path))
    b = GrammarCompiler(backend, timeout_s=120, disk=_disk(backend, tmp_path))
    try:
        assert not b.disk.has(KEYS[2])  # indexed before anything was written
        a.compile(KEYS[2])
        a.disk.shutdown()  # written
        deadline = time.monotonic() + 60
        while not b.disk.has(KEYS[2]) and time.monotonic() < deadline:
            time.sleep(0.05)  # each miss asks for a rescan
        b.compile(KEYS[2])
        assert b.pool.stats.compiles == 0 and b.disk.cache.stats.hits == 1
    finally:
        a.shutdown()
        b.shutdown()


def test_concurrent_writers_and_readers_never_see_half_a_file(tmp_path):
    """Replicas writing and reading one key at once (two caches on one folder, as two
    processes would be): every read is a miss or a whole, valid payload, never an error."""
    import threading

    writers = [GrammarDiskCache(tmp_path, "xgrammar", "id") for _ in range(2)]
    reader = GrammarDiskCache(tmp_path, "xgrammar", "id")
    payloads = [bytes([i]) * (1 << 20) for i in range(2)]  # 1 MiB: many write() calls each
    stop = threading.Event()

    def write(cache, payload):
        while not stop.is_set():
            cache.store(KEYS[0], payload)
    threads = [threading.Thread(target=write, args=wp) for wp in zip(writers, payloads)]
    for t in threads:
        t.start()
    try:
        seen = [reader.load(KEYS[0]) for _ in range(200)]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert reader.stats.errors == 0
    assert {p for p in seen if p is not None} <= set(payloads) and any(seen)
    assert not list(tmp_path.rglob("*.tmp"))  # no temporary file left behind


def test_config_switches(backends, tmp_path, monkeypatch):
    """Where the engine's cache goes and what turns it off (EngineConfig fields, env)."""
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.grammar.compile.disk_cache import default_cache_dir, disk_cache_from_config

    backend = backends["xgrammar"]
    monkeypatch.delenv("SGDSL_GRAMMAR_DISK_CACHE", raising=False)
    monkeypatch.delenv("SGDSL_GRAMMAR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "sgdsl" / "grammars"
    assert disk_cache_from_config(EngineConfig(), backend).root == default_cache_dir()
    monkeypatch.setenv("SGDSL_GRAMMAR_CACHE_DIR", str(tmp_path / "env"))
    assert disk_cache_from_config(EngineConfig(), backend).root == tmp_path / "env"
    named = EngineConfig(grammar_cache_dir=str(tmp_path / "cfg"))
    assert disk_cache_from_config(named, backend).root == tmp_path / "cfg"
    monkeypatch.setenv("SGDSL_GRAMMAR_DISK_CACHE", "0")  # the default folder off ...
    assert disk_cache_from_config(EngineConfig(), backend) is None
    assert disk_cache_from_config(named, backend) is not None  # ... a named one still on
    assert disk_cache_from_config(named.replace(disable_grammar_disk_cache=True), backend) is None
    assert disk_cache_from_config(named.replace(grammar_cache_bytes=0), backend) is None


def test_server_flags():
    from sgdsl.runtime.server.cli import parse_args

    config, _ = parse_args(["--grammar-cache-dir", "/x", "--grammar-cache-bytes", "4096",
                            "--disable-grammar-disk-cache"])
    assert (config.grammar_cache_dir, config.grammar_cache_bytes) == ("/x", 4096)
    assert config.disable_grammar_disk_cache

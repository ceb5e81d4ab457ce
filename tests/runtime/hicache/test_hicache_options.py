"""The hierarchical cache's engine options: SGLang's names as EngineConfig fields and
``sgdsl serve`` flags, refused with a clear error when they make no sense, and its counters
exported at /metrics."""
from __future__ import annotations

import pytest

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.errors import InvalidRequestError


def test_serve_flags_reach_the_config():
    from sgdsl.runtime.server.cli import parse_args

    config, _ = parse_args(["--enable-hierarchical-cache", "--hicache-ratio", "4",
                            "--hicache-size", "12.5", "--hicache-write-policy", "write_back",
                            "--hicache-storage-backend", "file", "--hicache-storage-dir", "/x",
                            "--hicache-storage-size", "3", "--hicache-io-backend", "direct"])
    assert config.enable_hierarchical_cache and config.hicache_ratio == 4.0
    assert config.hicache_size == 12.5 and config.hicache_write_policy == "write_back"
    assert config.hicache_storage_backend == "file" and config.hicache_storage_dir == "/x"
    assert config.hicache_storage_size == 3.0 and config.hicache_io_backend == "direct"
    assert parse_args([])[0].hicache_io_backend == "kernel"
    assert not parse_args([])[0].enable_hierarchical_cache


@pytest.mark.parametrize("kwargs, field, words", [
    (dict(hicache_ratio=1.0), "hicache_ratio", "must be > 1"),
    (dict(hicache_size=-1.0), "hicache_size", ">= 0"),
    (dict(hicache_write_policy="write_sometimes"), "hicache_write_policy", "write_back"),
    (dict(hicache_storage_backend="hf3fs"), "hicache_storage_backend", "'file'"),
    (dict(hicache_io_backend="page_first"), "hicache_io_backend", "kernel or direct"),
    (dict(disable_radix_cache=True), "disable_radix_cache", "radix cache off"),
    (dict(hicache_storage_size=0.0), "hicache_storage_size", "> 0"),
])
def test_bad_options_are_refused_by_name(kwargs, field, words):
    with pytest.raises(InvalidRequestError) as info:
        EngineConfig(enable_hierarchical_cache=True, **kwargs)
    assert info.value.field == field and words in str(info.value)


def test_storage_tier_is_accepted_under_tp():
    config = EngineConfig(enable_hierarchical_cache=True, hicache_storage_backend="file",
                          tp_size=2)  # each rank stores its shard (test_hicache_engine: TP=2)
    assert config.hicache_storage_backend == "file" and config.tp_size == 2


def test_storage_needs_the_hierarchical_cache():
    with pytest.raises(InvalidRequestError, match="needs enable_hierarchical_cache"):
        EngineConfig(hicache_storage_backend="file")
    EngineConfig(enable_hierarchical_cache=True, hicache_size=4.0, hicache_ratio=0.5)  # size wins


def test_hicache_stats_are_exported_at_metrics():
    from sgdsl.runtime.server.metrics import _EngineCollector

    stats = {"hicache_host_hit_tokens": 7, "hicache_bytes_host_to_device": 1024,
             "hicache_load_latency_avg_s": 0.002, "hicache_storage_hit_tokens": 3}
    names = {family.name for family in _EngineCollector(lambda: stats).collect()}
    assert {f"sgdsl_engine_{k}" for k in stats} <= names


def test_hicache_size_sizes_the_host_pool_over_the_ratio():
    from types import SimpleNamespace

    import torch

    from sgdsl.runtime.cache.hicache.factory import make_tree
    from sgdsl.runtime.cache.host_pool import GB
    from sgdsl.runtime.cache.pool import TokenKVPool

    runner = SimpleNamespace(token_kv_pool=TokenKVPool(100, 2, 1, 4, torch.float32, "cpu"))
    per_token = 2 * 2 * 4 * 4  # layers x (K, V) x head_dim x 4 bytes
    tree = make_tree(runner, EngineConfig(enable_hierarchical_cache=True, hicache_ratio=8))
    assert tree.host.size == 800
    tree = make_tree(runner, EngineConfig(enable_hierarchical_cache=True, hicache_ratio=8,
                                          hicache_size=64_000 / GB))
    assert tree.host.size == 64_000 // per_token  # GB wins over the ratio
    with pytest.raises(ValueError, match="fewer than the device pool"):
        make_tree(runner, EngineConfig(enable_hierarchical_cache=True,
                                       hicache_size=3_200 / GB))

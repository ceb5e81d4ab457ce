"""Builds a scheduler's prefix cache: the plain radix cache, or the tiered one when
``enable_hierarchical_cache`` is on."""
from __future__ import annotations

import logging
from typing import Any

from ...distributed.collectives import min_over_ranks
from ..host_pool import GB, HostKVPool
from ..radix import RadixCache
from .options import storage_dir

logger = logging.getLogger(__name__)


def make_tree(runner: Any, config: Any) -> RadixCache:
    pool = runner.token_kv_pool
    if not config.enable_hierarchical_cache:
        return RadixCache(pool, disable=config.disable_radix_cache)
    from .storage import PAGE_TOKENS, FileStorage
    from .tree import HiRadixCache

    slots = HostKVPool.num_slots(pool, config.hicache_ratio, config.hicache_size)
    if slots < pool.size:
        raise ValueError(f"hicache_size={config.hicache_size} GB holds {slots} tokens, fewer "
                         f"than the device pool's {pool.size}: the host pool must be larger")
    host = HostKVPool(slots, pool, pin_memory=pool.device.type == "cuda")
    storage = None
    lockstep = config.tp_size * config.pp_size > 1
    if config.hicache_storage_backend == "file":
        # NOTE: each TP rank stores its shard (its KV heads), budgeted per rank
        storage = FileStorage(storage_dir(config), _identity(runner, config),
                              int(config.hicache_storage_size * GB),
                              (pool.num_layers, 2, PAGE_TOKENS, *host.row_shape), host.raw_dtype,
                              shard=f"tp{runner.tp_rank}of{runner.tp_size}")
    logger.info("hicache: host pool %d tokens (%.2f GB, %s, pinned %s), storage %s", slots,
                slots * host.bytes_per_token / GB, config.hicache_write_policy, host.pinned,
                storage.dir if storage else "off")
    if pool.device.type == "cuda" and not host.pinned:
        # NOTE: then every copy to or from it holds the scheduler thread until it is done
        logger.warning("hicache: the CUDA runtime does not see the host pool as page-locked: "
                       "its copies will block the scheduler")
    # lockstep: every rank's storage hits must agree, or the ranks' trees (and batches) diverge
    agree = min_over_ranks if lockstep and storage is not None else None
    return HiRadixCache(pool, host, config.hicache_write_policy, storage, lockstep=lockstep,
                        agree=agree, io_backend=config.hicache_io_backend)


def _identity(runner: Any, config: Any) -> str:
    """What a stored page's KV depends on besides its tokens (the root of its key); the TP
    shard is in the file name. pp: a stage's layers are part of it (stages of the same size
    hold different layers)."""
    pool = runner.token_kv_pool
    stage = runner.pp_stage
    weights = f"dummy(seed={config.seed})" if config.load_format == "dummy" else "weights"
    return (f"model={runner.model_dir}|{weights}|quant={config.quantization}|"
            f"dtype={runner.dtype}|kv={pool.dtype}|layers={pool.num_layers}|"
            f"kv_heads,head_dim={tuple(pool.k_buffer[0].shape[1:])}|"
            f"stage_layers={stage.start}-{stage.end}/{stage.num_layers}")

"""Validation of the hierarchical cache's engine options (SGLang's names), run when an
``EngineConfig`` is built, so a bad combination fails before any process starts."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...errors import InvalidRequestError


def check_options(config: Any) -> None:
    def bad(field: str, message: str) -> InvalidRequestError:
        return InvalidRequestError(f"{field}={getattr(config, field)!r}: {message}", field=field)

    if config.hicache_write_policy not in ("write_through", "write_back",
                                           "write_through_selective"):
        raise bad("hicache_write_policy",
                  "must be write_through, write_back or write_through_selective")
    if config.hicache_io_backend not in ("kernel", "direct"):
        raise bad("hicache_io_backend", "must be kernel or direct")
    if config.hicache_storage_backend not in (None, "file"):
        raise bad("hicache_storage_backend", "the only storage backend is 'file'")
    if not config.hicache_size >= 0:
        raise bad("hicache_size", "must be >= 0 (GB of host memory; 0: use hicache_ratio)")
    if not config.hicache_storage_size > 0:
        raise bad("hicache_storage_size", "must be > 0 (GB of files)")
    if not config.enable_hierarchical_cache:
        if config.hicache_storage_backend is not None:
            raise bad("hicache_storage_backend", "needs enable_hierarchical_cache=True")
        return
    if config.disable_radix_cache:
        raise bad("disable_radix_cache", "the hierarchical cache extends the radix cache; "
                                         "it cannot be on with the radix cache off")
    if config.hicache_size == 0 and not config.hicache_ratio > 1:
        raise bad("hicache_ratio", "must be > 1: the host pool holds copies of what is on the "
                                   "device, so it must be larger than the device pool")


def storage_dir(config: Any) -> Path:
    """``hicache_storage_dir``, else $SGDSL_HICACHE_DIR, else $XDG_CACHE_HOME/sgdsl/hicache,
    else ~/.cache/sgdsl/hicache."""
    if config.hicache_storage_dir:
        return Path(config.hicache_storage_dir)
    if os.environ.get("SGDSL_HICACHE_DIR"):
        return Path(os.environ["SGDSL_HICACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sgdsl" / "hicache"

"""Tests of the KV pools: alloc/free accounting, the reserved dummy slot, integrity checks."""
from __future__ import annotations

import torch

from sgdsl.runtime.cache.pool import ReqToTokenPool, TokenKVPool


def test_token_pool_alloc_free_roundtrip_never_hands_out_slot_zero() -> None:
    pool = TokenKVPool(10, num_layers=2, num_kv_heads=1, head_dim=4, dtype=torch.float32,
                       device="cpu")
    a = pool.alloc(7)
    assert a is not None and 0 not in a.tolist() and len(set(a.tolist())) == 7
    assert pool.alloc(4) is None and pool.available() == 3
    b = pool.alloc(3)
    assert sorted(a.tolist() + b.tolist()) == list(range(1, 11))
    pool.free(a[:2])
    pool.free(b)
    assert pool.available() == 5
    pool.check_integrity()
    assert pool.k_buffer[0].shape == (11, 1, 4)


def test_token_pool_set_kv_writes_rows() -> None:
    pool = TokenKVPool(4, num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                       device="cpu")
    loc = pool.alloc(2)
    pool.set_kv(0, loc, torch.ones(2, 1, 2), torch.full((2, 1, 2), 2.0))
    assert bool((pool.k_buffer[0][loc] == 1).all()) and bool((pool.v_buffer[0][loc] == 2).all())


def test_token_pool_detects_double_free() -> None:
    pool = TokenKVPool(4, num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                       device="cpu")
    a = pool.alloc(3)
    pool.free(a[:1])
    pool.free(a[:1])  # fits in the list, so only the integrity check can catch it
    try:
        pool.check_integrity()
    except AssertionError:
        return
    raise AssertionError("double free not detected")


def test_req_to_token_pool_rows() -> None:
    pool = ReqToTokenPool(3, 8, "cpu")
    rows = [pool.alloc() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2] and pool.alloc() is None
    pool.free(rows[1])
    assert pool.available() == 1 and pool.alloc() == rows[1]
    pool.check_integrity()

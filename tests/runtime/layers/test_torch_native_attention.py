"""TorchNativeAttnBackend vs a float64 reference over the paged pool: an extend batch mixing
a request with a cached prefix and a fresh one, then a decode batch of mixed lengths (padded
path) and a batch-1 decode; GQA with 6 query heads over 2 kv heads."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from sgdsl.runtime.cache.pool import ReqToTokenPool, TokenKVPool
from sgdsl.runtime.layers.attention.torch_native import TorchNativeAttnBackend
from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode

H, KVH, D = 6, 2, 16
SCALE = D ** -0.5


def make_runner():
    gen = torch.Generator().manual_seed(0)
    kv = TokenKVPool(60, 1, KVH, D, torch.float32, "cpu")
    kv.k_buffer[0].copy_(torch.randn(61, KVH, D, generator=gen))
    kv.v_buffer[0].copy_(torch.randn(61, KVH, D, generator=gen))
    return SimpleNamespace(device=torch.device("cpu"), req_to_token_pool=ReqToTokenPool(4, 32, "cpu"),
                           token_kv_pool=kv)


def batch(mode, rows, prefix, new, slots) -> ForwardBatch:
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    seq = [p + n for p, n in zip(prefix, new)]
    return ForwardBatch(mode=mode, batch_size=len(rows), input_ids=t([0] * sum(new)),
                        positions=t([p + i for p, n in zip(prefix, new) for i in range(n)]),
                        req_pool_indices=t(rows), seq_lens=t(seq), out_cache_loc=t(slots),
                        extend_prefix_lens=t(prefix), extend_seq_lens=t(new),
                        extend_start_loc=t([sum(new[:i]) for i in range(len(new))]),
                        seq_lens_cpu=seq, extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=new)


def reference(q, runner, row, seq_len, n_new):
    slots = runner.req_to_token_pool.req_to_token[row, :seq_len]
    k = runner.token_kv_pool.k_buffer[0][slots].double().repeat_interleave(H // KVH, dim=1)
    v = runner.token_kv_pool.v_buffer[0][slots].double().repeat_interleave(H // KVH, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * SCALE
    q_pos = torch.arange(seq_len - n_new, seq_len)[:, None]
    scores = scores.masked_fill(torch.arange(seq_len)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run(backend, runner, b, q, k, v):
    backend.init_forward_metadata(b)
    return backend.forward(q, k, v, 0, b, SCALE)


def test_extend_then_decode_match_reference():
    runner = make_runner()
    backend = TorchNativeAttnBackend(runner)
    table = runner.req_to_token_pool.req_to_token
    table[0, :5] = torch.arange(1, 6)  # request 0: 5 cached tokens at slots 1..5
    table[0, 5:9] = torch.tensor([20, 21, 22, 23])
    table[1, :3] = torch.tensor([30, 31, 32])  # request 1: fresh, 3 tokens
    b = batch(ForwardMode.EXTEND, [0, 1], [5, 0], [4, 3], [20, 21, 22, 23, 30, 31, 32])
    q, k, v = torch.randn(7, H, D), torch.randn(7, KVH, D), torch.randn(7, KVH, D)
    out = run(backend, runner, b, q, k, v)
    assert torch.equal(runner.token_kv_pool.k_buffer[0][20:24], k[:4])  # new k/v stored
    assert torch.equal(runner.token_kv_pool.v_buffer[0][30:33], v[4:])
    torch.testing.assert_close(out[:4], reference(q[:4], runner, 0, 9, 4).float())
    torch.testing.assert_close(out[4:], reference(q[4:], runner, 1, 3, 3).float())

    table[0, 9], table[1, 3] = 40, 41  # decode: lengths 10 and 4 -> padded batch
    b = batch(ForwardMode.DECODE, [0, 1], [9, 3], [1, 1], [40, 41])
    q, k, v = torch.randn(2, H, D), torch.randn(2, KVH, D), torch.randn(2, KVH, D)
    out = run(backend, runner, b, q, k, v)
    assert b.attn_metadata.mask is not None
    torch.testing.assert_close(out[:1], reference(q[:1], runner, 0, 10, 1).float())
    torch.testing.assert_close(out[1:], reference(q[1:], runner, 1, 4, 1).float())

    table[1, 4] = 42  # batch-1 decode: no mask
    b = batch(ForwardMode.DECODE, [1], [4], [1], [42])
    q, k, v = torch.randn(1, H, D), torch.randn(1, KVH, D), torch.randn(1, KVH, D)
    out = run(backend, runner, b, q, k, v)
    assert b.attn_metadata.mask is None
    torch.testing.assert_close(out, reference(q, runner, 1, 5, 1).float())

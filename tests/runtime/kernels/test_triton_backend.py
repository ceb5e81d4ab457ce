"""TritonAttnBackend vs TorchNativeAttnBackend on the same pool contents: an extend batch with a
cached prefix and a fresh request, then a decode step, must give the same outputs and KV."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from sgdsl.runtime.cache.pool import ReqToTokenPool, TokenKVPool
from sgdsl.runtime.layers.attention.torch_native import TorchNativeAttnBackend
from sgdsl.runtime.layers.attention.triton import TritonAttnBackend
from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode

from .conftest import rel_err, tol

H, KVH, D = 6, 2, 24


def _runner(device, dtype, gen):
    r2t = ReqToTokenPool(4, 64, device)
    kv = TokenKVPool(50, 1, KVH, D, dtype, device)
    kv.k_buffer[0].copy_(torch.randn(51, KVH, D, generator=gen))
    kv.v_buffer[0].copy_(torch.randn(51, KVH, D, generator=gen))
    return SimpleNamespace(device=torch.device(device), req_to_token_pool=r2t, token_kv_pool=kv,
                           model_config=SimpleNamespace(num_heads=H, head_dim=D))


def _batch(mode, rows, prefix, new, slots_new, device):
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
    seq = [p + n for p, n in zip(prefix, new)]
    start = [sum(new[:i]) for i in range(len(new))]
    positions = [p + j for p, n in zip(prefix, new) for j in range(n)]
    return ForwardBatch(mode, len(rows), t([0] * sum(new)), t(positions), t(rows), t(seq),
                        t(slots_new), t(prefix), t(new), t(start), seq_lens_cpu=seq,
                        extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=new)


def _step(backends, batch, gen, device, dtype):
    n = batch.num_tokens
    q = torch.randn(n, H, D, generator=gen).to(dtype).to(device)
    k = torch.randn(n, KVH, D, generator=gen).to(dtype).to(device)
    v = torch.randn(n, KVH, D, generator=gen).to(dtype).to(device)
    outs = []
    for b in backends:
        b.init_forward_metadata(batch)
        outs.append(b.forward(q, k, v, 0, batch, D ** -0.5))
    return outs


def test_extend_then_decode_matches_torch_native(device, dtype):
    gen = torch.Generator().manual_seed(0)
    runners = [_runner(device, dtype, gen) for _ in range(2)]
    runners[1].token_kv_pool.k_buffer[0].copy_(runners[0].token_kv_pool.k_buffer[0])
    runners[1].token_kv_pool.v_buffer[0].copy_(runners[0].token_kv_pool.v_buffer[0])
    # request row 2 has a cached 5-token prefix at slots 40..44; row 0 is fresh.
    prefix_slots = [40, 41, 42, 43, 44]
    new_slots = {2: [3, 9, 17], 0: [20, 21, 22, 23, 24, 25, 26]}
    for r in runners:
        r.req_to_token_pool.req_to_token[2, :8] = torch.tensor(prefix_slots + new_slots[2])
        r.req_to_token_pool.req_to_token[0, :7] = torch.tensor(new_slots[0])
    backends = [TritonAttnBackend(runners[0]), TorchNativeAttnBackend(runners[1])]
    ext = _batch(ForwardMode.EXTEND, [2, 0], [5, 0], [3, 7], new_slots[2] + new_slots[0], device)
    ours, ref = _step(backends, ext, gen, device, dtype)
    assert rel_err(ours, ref) < tol(dtype)
    for r in runners:
        r.req_to_token_pool.req_to_token[2, 8] = 30
        r.req_to_token_pool.req_to_token[0, 7] = 31
    dec = _batch(ForwardMode.DECODE, [2, 0], [8, 7], [1, 1], [30, 31], device)
    ours, ref = _step(backends, dec, gen, device, dtype)
    assert rel_err(ours, ref) < tol(dtype)
    for name in ("k_buffer", "v_buffer"):
        assert torch.equal(getattr(runners[0].token_kv_pool, name)[0],
                           getattr(runners[1].token_kv_pool, name)[0])

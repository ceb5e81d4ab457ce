"""TritonAttnBackend vs TorchNativeAttnBackend on the same pool contents: an extend batch with a
cached prefix and a fresh request, then a decode step, must give the same outputs and KV; also
with an fp8 (E4M3) pool with per-layer scales (GPU only: Triton's interpreter converts fp8
inexactly)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgdsl.runtime.cache.pool import ReqToTokenPool, TokenKVPool
from sgdsl.runtime.layers.attention.torch_native import TorchNativeAttnBackend
from sgdsl.runtime.layers.attention.triton import TritonAttnBackend, TritonMixedMetadata
from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode

from .conftest import ON_GPU, rel_err, tol

H, KVH, D = 6, 2, 24


def _runner(device, dtype, gen, kv_dtype=None):
    r2t = ReqToTokenPool(4, 64, device)
    kv = TokenKVPool(50, 1, KVH, D, kv_dtype or dtype, device)
    kv.set_scales({0: (0.5, 2.0)})  # used only by an fp8 pool
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


@pytest.mark.parametrize("kv_dtype", [None, pytest.param(
    torch.float8_e4m3fn, marks=[pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="CUDA")])])
def test_extend_then_decode_matches_torch_native(device, dtype, kv_dtype):
    gen = torch.Generator().manual_seed(0)
    runners = [_runner(device, dtype, gen, kv_dtype) for _ in range(2)]
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
        ours_kv, ref_kv = (getattr(r.token_kv_pool, name)[0] for r in runners)
        assert torch.equal(ours_kv.view(torch.uint8) if kv_dtype else ours_kv,
                           ref_kv.view(torch.uint8) if kv_dtype else ref_kv)


def test_mixed_extend_matches_torch_native(device, dtype):
    """One-token rows beside multi-token rows (prompts cached but for their last token):
    the one-token rows go through the decode kernel, the others through the extend kernel,
    interleaved in the token order."""
    gen = torch.Generator().manual_seed(1)
    runners = [_runner(device, dtype, gen) for _ in range(2)]
    for name in ("k_buffer", "v_buffer"):
        getattr(runners[1].token_kv_pool, name)[0].copy_(getattr(runners[0].token_kv_pool, name)[0])
    # (row, prefix slots, new slots): one-token rows 2 and 1 around multi-token rows 0 and 3
    layout = [(2, [40, 41, 42, 43, 44], [3]), (0, [], [20, 21, 22, 23]),
              (1, [10, 11, 12], [13]), (3, [30, 31], [32, 33, 34])]
    for r in runners:
        for row, prefix, new in layout:
            r.req_to_token_pool.req_to_token[row, :len(prefix) + len(new)] = torch.tensor(
                prefix + new)
    backends = [TritonAttnBackend(runners[0]), TorchNativeAttnBackend(runners[1])]
    batch = _batch(ForwardMode.EXTEND, [row for row, _, _ in layout],
                   [len(p) for _, p, _ in layout], [len(n) for _, _, n in layout],
                   [s for _, _, n in layout for s in n], device)
    backends[0].init_forward_metadata(batch)
    assert isinstance(batch.attn_metadata, TritonMixedMetadata)
    ours, ref = _step(backends, batch, gen, device, dtype)
    assert rel_err(ours, ref) < tol(dtype)

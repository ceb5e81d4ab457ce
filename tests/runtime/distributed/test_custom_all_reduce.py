"""The custom all-reduce (runtime/distributed/custom_all_reduce.py): which algorithm serves
which message, where it switches itself off, and on 2 GPUs that it sums like NCCL."""
from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from sgdsl.runtime.distributed import collectives, custom_all_reduce
from sgdsl.runtime.distributed.custom_all_reduce import AllReducePlan, SymmMemAllReduce
from sgdsl.runtime.distributed.state import TPGroup


def _fake(size: int = 2, max_bytes: int = 8 << 20) -> SymmMemAllReduce:
    """An instance over a plain buffer: enough for the size/alignment decisions."""
    group = TPGroup(0, size, SimpleNamespace(group_name="g"), torch.device("cpu"), None)
    buffer = torch.empty(max_bytes // 2, dtype=torch.bfloat16)
    return SymmMemAllReduce(group, buffer, AllReducePlan(1 << 20, max_bytes))


def test_plan_picks_by_size():
    plan = AllReducePlan(one_shot_max=1 << 20, two_shot_max=8 << 20)
    assert plan.choose(8 << 10) == "one_shot"  # batch-1 decode of an 8B model
    assert plan.choose(1 << 20) == "one_shot"
    assert plan.choose((1 << 20) + 16) == "two_shot"
    assert plan.choose((8 << 20) + 16) == "nccl"  # prefill-sized: NCCL's rings


def test_choose_keeps_unaligned_and_uneven_messages_on_nccl():
    ar = _fake(size=4)
    assert ar.choose(torch.empty(4096, dtype=torch.bfloat16)) == "one_shot"
    assert ar.choose(torch.empty(4097, dtype=torch.bfloat16)) == "nccl"  # not 16-byte vectors
    big = torch.empty(2 << 20, dtype=torch.bfloat16)  # 4 MB: two-shot, 4 even shares
    assert ar.choose(big) == "two_shot"
    uneven = torch.empty((2 << 20) + 8, dtype=torch.bfloat16)  # shares not whole vectors
    assert ar.choose(uneven) == "nccl"


def test_other_dtypes_and_host_tensors_never_take_it():
    ar = _fake()
    assert not ar.can_run(torch.empty(4096, dtype=torch.float32))
    assert not ar.can_run(torch.empty(4096, dtype=torch.bfloat16))  # on the host
    assert not ar.can_run(torch.empty(64, 64, dtype=torch.bfloat16).t())  # not contiguous


def test_off_without_cuda_or_a_group():
    cpu = TPGroup(0, 2, SimpleNamespace(group_name="g"), torch.device("cpu"), None)
    assert SymmMemAllReduce.create(cpu, torch.bfloat16) is None
    assert SymmMemAllReduce.create(TPGroup(), torch.bfloat16) is None
    assert not custom_all_reduce.install(cpu, torch.bfloat16)
    assert custom_all_reduce.lookup(cpu) is None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, errors) -> None:
    from sgdsl.runtime.distributed.state import destroy_tp_group, init_tp_group

    try:
        g = init_tp_group(rank, world, torch.device(f"cuda:{rank}"), f"tcp://127.0.0.1:{port}")
        assert custom_all_reduce.install(g, torch.bfloat16), "custom all-reduce did not install"
        ar = custom_all_reduce.lookup(g)
        for numel in (4096, 4096 * 8, 1 << 19, 1 << 21):  # 8 KB .. 4 MB: both algorithms
            x = torch.randn(numel, device="cuda", dtype=torch.bfloat16,
                            generator=torch.Generator("cuda").manual_seed(rank))
            ref = x.float().clone()
            collectives.all_reduce(ref)  # fp32: NCCL
            got = collectives.all_reduce(x)  # bf16: the custom one
            assert ar.choose(x) != "nccl"
            err = (got.float() - ref).abs().max().item()
            assert err < 0.1, (numel, err)
        y = torch.full((4096,), float(rank), device="cuda", dtype=torch.bfloat16)
        for step in range(50):  # back to back on the same buffer, each input from the last sum
            y = torch.remainder(collectives.all_reduce(y) + rank + 1, 16)
        vals = list(range(world))
        for step in range(50):
            vals = [(sum(vals) + r + 1) % 16 for r in range(world)]
        assert (y == vals[rank]).all().item()
        _check_lamport(ar, rank, world)
        destroy_tp_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {e!r}")
        raise


def _fused_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    from sgdsl.runtime.kernels.rmsnorm import fused_add_rmsnorm

    total = x.float().clone()
    collectives.all_reduce(total)  # fp32: NCCL
    return fused_add_rmsnorm(total.to(x.dtype), residual, weight, eps, inplace=False)


def _check_lamport(ar, rank: int, world: int) -> None:
    """The barrier-free kernel, plain and fused with add + RMSNorm, eager and replayed from a
    CUDA graph, interleaved with each other and with torch's one-shot kernel."""
    assert ar.lamport is not None, "the barrier-free all-reduce did not map its buffer"
    gen = torch.Generator("cuda").manual_seed(100 + rank)
    x = torch.randn(3, 4096, device="cuda", dtype=torch.bfloat16, generator=gen)
    residual = torch.randn(3, 4096, device="cuda", dtype=torch.bfloat16,
                           generator=torch.Generator("cuda").manual_seed(7))
    weight = torch.rand(4096, device="cuda", dtype=torch.bfloat16,
                        generator=torch.Generator("cuda").manual_seed(8)) + 0.5
    want_out, want_res = _fused_reference(x, residual, weight, 1e-5)
    assert ar.choose(x) == "lamport"
    for _ in range(3):  # eager, repeated: the phases alternate
        out, res = collectives.all_reduce_add_rmsnorm(x, residual, weight, 1e-5)
        assert (res.float() - want_res.float()).abs().max().item() < 0.05
        assert (out.float() - want_out.float()).abs().max().item() < 0.1
    y0 = torch.full((4096 * 5,), float(rank), device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = y0
        for step in range(100):
            y = torch.remainder(collectives.all_reduce(y) + rank + 1, 16)
            out, res = collectives.all_reduce_add_rmsnorm(x, residual, weight, 1e-5)
            if step % 10 == 0:  # a mid-size message on torch's kernel in between
                ar.all_reduce(torch.ones(1 << 19, device="cuda", dtype=torch.bfloat16),
                              "one_shot")
    vals = [float(r) for r in range(world)]
    for replay in range(3):
        graph.replay()
        for _ in range(100):
            vals = [(sum(vals) + r + 1) % 16 for r in range(world)]
        y0.copy_(y)  # the next replay continues the chain
    torch.cuda.synchronize()
    assert (y == vals[rank]).all().item(), "a stale or early read in the graph"
    assert (out.float() - want_out.float()).abs().max().item() < 0.1


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_sums_like_nccl_on_two_gpus():
    errors = mp.get_context("spawn").Queue()
    mp.spawn(_rank, args=(2, _port(), errors), nprocs=2, join=True)
    assert errors.empty()


def test_barrier_free_kernel_takes_the_smallest_messages():
    from sgdsl.runtime.distributed.lamport import LamportAllReduce

    ar = _fake(size=4)
    ar.lamport = LamportAllReduce(ar.group, torch.empty(0, dtype=torch.int16), 0,
                                  slot=(512 << 10) // 2)
    bf16 = torch.bfloat16
    assert ar.choose(torch.empty(4096, dtype=bf16)) == "lamport"  # batch-1 decode, 8B
    assert ar.choose(torch.empty(128 << 10, dtype=bf16)) == "lamport"  # 256 KB
    assert ar.choose(torch.empty((128 << 10) + 8, dtype=bf16)) == "one_shot"
    assert ar.lamport.fits(torch.empty(32, 8192, dtype=bf16))  # 512 KB: fused with the norm
    assert not ar.lamport.fits(torch.empty(64, 8192, dtype=bf16))
    assert not ar.lamport.fits(torch.empty(4096, dtype=torch.float32))

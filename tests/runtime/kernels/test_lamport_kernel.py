"""The barrier-free all-reduce kernel (kernels/lamport_all_reduce.py) on one process: rank 0 of a
group whose peers' pushes are written into its buffer by the test before the call, so the
kernel's own logic runs alone: its push into every buffer, the spin over the peers' slots (all
at once, or one after another with ``SGDSL_LAMPORT_SPIN=serial``), the sum in rank order,
the slots marked empty again, the phases alternating, the fused residual add + RMSNorm.

Under Triton's interpreter on a CPU (fp16: numpy has no bf16), and compiled on a GPU with the
buffers on that GPU; the real multi-GPU exchange is tests/runtime/distributed/
test_custom_all_reduce.py (``-m gpu``)."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.kernels.lamport_all_reduce import EMPTY, GRID, lamport_all_reduce
from sgdsl.runtime.kernels.rmsnorm import fused_add_rmsnorm

HALF = torch.float16


class FakeGroup:
    """Rank 0's view of a ``world``-rank group: every rank's buffer (two phases of ``world``
    slots of ``slot`` elements each, all empty), their addresses as the kernel reads them."""

    def __init__(self, world: int, slot: int, device: str) -> None:
        self.world, self.slot = world, slot
        self.buffers = [torch.full((2 * world * slot,), EMPTY, dtype=torch.int16, device=device)
                        for _ in range(world)]
        self.ptrs = torch.tensor([b.data_ptr() for b in self.buffers], dtype=torch.int64,
                                 device=device)
        self.counters = torch.zeros(GRID, dtype=torch.int32, device=device)

    def peer_slot(self, phase: int, rank: int) -> torch.Tensor:
        """Where ``rank``'s push lands in rank 0's buffer in ``phase``."""
        start = (phase * self.world + rank) * self.slot
        return self.buffers[0][start:start + self.slot]

    def arrive(self, phase: int, parts: list[torch.Tensor]) -> None:
        """The peers' parts (ranks 1..) as their pushes would leave them (-0.0 sent as +0.0)."""
        for rank, part in enumerate(parts, start=1):
            bits = part.reshape(-1).view(torch.int16).clone()
            bits[bits == EMPTY] = 0
            self.peer_slot(phase, rank)[: bits.numel()] = bits


def _parts(world: int, shape: tuple[int, ...], device: str, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    parts = [torch.randn(shape, generator=gen).to(HALF).to(device) for _ in range(world)]
    parts[0].view(-1)[0] = -0.0  # the empty mark's bits in the input: sent as +0.0
    return parts


def _reference(parts: list[torch.Tensor]) -> torch.Tensor:
    total = torch.zeros(parts[0].shape, dtype=torch.float32, device=parts[0].device)
    for p in parts:  # rank order, in fp32, rounded once: as the kernel sums
        total += p.float()
    return total.to(HALF)


@pytest.fixture(params=["all", "serial"])
def spin(request, monkeypatch):
    """The tp-chain switches on (one spin over every peer, 16-byte vectors) or as first built
    (a spin per peer, 2-byte elements)."""
    monkeypatch.setenv("SGDSL_LAMPORT_SPIN", request.param)
    monkeypatch.setenv("SGDSL_LAMPORT_VEC", "1" if request.param == "all" else "0")
    return request.param


@pytest.mark.parametrize("world", [2, 4])
def test_plain_sum_two_phases(device, spin, world):
    n = 1024 * 2 + 96  # three chunks, the last one partial
    g = FakeGroup(world, 4096, device)
    for call in range(3):  # phases 0, 1, 0: the slots read are empty again after each call
        parts = _parts(world, (n,), device, seed=10 * world + call)
        g.arrive(call % 2, parts[1:])
        out = torch.empty_like(parts[0])
        lamport_all_reduce(parts[0], out, g.ptrs.data_ptr(), g.counters, g.slot, 0, world)
        assert torch.equal(out, _reference(parts))
        for rank in range(world):  # rank 0 read and emptied every slot of this phase
            assert (g.peer_slot(call % 2, rank) == EMPTY).all()
        pushed = g.buffers[1][(call % 2) * world * g.slot:][:n]  # rank 0's push to rank 1
        want = parts[0].view(torch.int16).clone()
        want[want == EMPTY] = 0
        assert torch.equal(pushed, want)
        g.buffers[1].fill_(EMPTY)
    assert (g.counters == 3).all()


def test_fused_add_rmsnorm(device, spin):
    world, rows, hidden = 4, 3, 320  # a row per chunk; 320 wide: a masked 512 block
    g = FakeGroup(world, 4096, device)
    gen = torch.Generator().manual_seed(3)
    residual = torch.randn(rows, hidden, generator=gen).to(HALF).to(device)
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(HALF).to(device)
    for call in range(2):
        parts = _parts(world, (rows, hidden), device, seed=20 + call)
        g.arrive(call % 2, parts[1:])
        out, res_out = torch.empty_like(parts[0]), torch.empty_like(residual)
        lamport_all_reduce(parts[0], out, g.ptrs.data_ptr(), g.counters, g.slot, 0, world,
                           residual=residual, weight=weight, res_out=res_out, eps=1e-5)
        want_out, want_res = fused_add_rmsnorm(_reference(parts), residual, weight, 1e-5,
                                               inplace=False)
        assert torch.equal(res_out, want_res)
        assert (out.float() - want_out.float()).abs().max().item() < 2e-2
        assert (g.peer_slot(call % 2, 2) == EMPTY).all()

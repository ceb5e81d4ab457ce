"""The tensor-parallel group of this process: which rank it is, how many ranks there are, and
the torch.distributed groups that join them.

Every process starts with the trivial group (rank 0 of 1, no process group): every collective
is then a no-op, so models, loaders and tests that never call ``init_tp_group`` run exactly as
on one device. A TP worker process calls ``init_tp_group`` once, before it builds its model.

Two groups: ``group`` carries tensors on the rank's device (NCCL on CUDA, gloo on CPU) and
``cpu_group`` (always gloo) carries Python objects (the scheduler's messages, see
``collectives.broadcast_object``), so host-side traffic never occupies the GPU stream.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ..errors import ModelLoadError


@dataclass(frozen=True)
class TPGroup:
    """This process's place in its tensor-parallel group."""

    rank: int = 0
    size: int = 1
    group: Any = None  # torch ProcessGroup for device tensors; None at size 1
    device: torch.device = torch.device("cpu")
    cpu_group: Any = None  # gloo ProcessGroup for Python objects; None at size 1

    @property
    def is_first(self) -> bool:
        return self.rank == 0


_TP = TPGroup()


def get_tp_group() -> TPGroup:
    return _TP


def tp_rank() -> int:
    return _TP.rank


def tp_size() -> int:
    return _TP.size


def init_tp_group(rank: int, size: int, device: torch.device, init_method: str,
                  timeout_s: float = 600.0) -> TPGroup:
    """Join the ``size``-rank group at ``init_method`` (``tcp://host:port``) as ``rank``.

    The device group uses NCCL on CUDA and gloo on CPU; a second gloo group carries objects.
    ``timeout_s`` bounds how long a collective may wait for a missing rank (start-up included)."""
    global _TP
    if size == 1:
        _TP = TPGroup(0, 1, None, device, None)
        return _TP
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                                timeout=timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - torch raises several kinds for a bad rendezvous
        raise ModelLoadError(f"tensor-parallel rank {rank}/{size}: cannot join the process "
                             f"group at {init_method}: {e}") from e
    group = dist.group.WORLD
    cpu_group = group if backend == "gloo" else dist.new_group(
        backend="gloo", timeout=timedelta(seconds=timeout_s))
    _TP = TPGroup(rank, size, group, device, cpu_group)
    return _TP


def destroy_tp_group() -> None:
    """Leave the group (if any) and return to the trivial one."""
    global _TP
    if _TP.size > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _TP = dataclasses.replace(TPGroup(), device=_TP.device)


def set_tp_group_for_test(group: TPGroup) -> None:
    """Pretend to be ``group.rank`` of ``group.size`` without a process group (shape-level
    tests of the parallel layers build one rank's shard in one process)."""
    global _TP
    _TP = group

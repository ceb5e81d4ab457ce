"""The tensor-parallel group of this process: which rank it is, how many ranks there are, and
the torch.distributed groups that join them.

Every process starts with the trivial group (rank 0 of 1, no process group): every collective
is then a no-op, so models, loaders and tests that never call ``init_tp_group`` run exactly as
on one device. A TP worker process calls ``init_tp_group`` once, before it builds its model.

Two groups: ``group`` carries tensors on the rank's device (NCCL on CUDA, gloo on CPU) and
``cpu_group`` (always gloo) carries Python objects (the scheduler's messages, see
``collectives.broadcast_object``), so host-side traffic never occupies the GPU stream.

Expert parallelism (``ep_size`` > 1) adds two subgroups of the same ranks, laid out as SGLang
does (``moe_ep_rank = tp_rank // (tp_size // ep_size)``): the MoE-TP group, ``tp_size //
ep_size`` consecutive ranks that hold the same experts and split their intermediate dim, and
the EP group, the ``ep_size`` ranks with the same place in their MoE-TP group, which split the
experts and exchange tokens (``get_ep_group`` / ``get_moe_tp_group``; at ep_size 1 the EP
group is trivial and the MoE-TP group is the TP group).
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
_EP: TPGroup | None = None  # None: trivial (ep_size 1)
_MOE_TP: TPGroup | None = None  # None: the TP group itself


def get_tp_group() -> TPGroup:
    return _TP


def tp_rank() -> int:
    return _TP.rank


def tp_size() -> int:
    return _TP.size


def get_ep_group() -> TPGroup:
    """The ranks that split the experts (rank 0 of 1 without expert parallelism)."""
    return _EP if _EP is not None else TPGroup(device=_TP.device)


def get_moe_tp_group() -> TPGroup:
    """The ranks that hold the same experts and split their intermediate dim."""
    return _MOE_TP if _MOE_TP is not None else _TP


def ep_layout(rank: int, size: int, ep_size: int) -> tuple[list[int], list[int]]:
    """(this rank's EP group, its MoE-TP group): global ranks, in group-rank order."""
    moe_tp = size // ep_size
    first = rank - rank % moe_tp
    return list(range(rank % moe_tp, size, moe_tp)), list(range(first, first + moe_tp))


def init_tp_group(rank: int, size: int, device: torch.device, init_method: str,
                  timeout_s: float = 600.0, ep_size: int = 1) -> TPGroup:
    """Join the ``size``-rank group at ``init_method`` (``tcp://host:port``) as ``rank``.

    The device group uses NCCL on CUDA and gloo on CPU; a second gloo group carries objects.
    ``timeout_s`` bounds how long a collective may wait for a missing rank (start-up included).
    ``ep_size`` > 1 also forms the expert-parallel subgroups (see the module docstring)."""
    global _TP
    if size % ep_size:
        raise ModelLoadError(f"ep_size={ep_size} must divide tp_size={size}")
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
    if ep_size > 1:
        _init_ep_groups(ep_size, timeout_s)
    return _TP


def _init_ep_groups(ep_size: int, timeout_s: float) -> None:
    """Every rank creates every subgroup, in the same order (torch.distributed requires it),
    and keeps the two it belongs to."""
    global _EP, _MOE_TP
    import torch.distributed as dist

    rank, size = _TP.rank, _TP.size
    moe_tp = size // ep_size
    if moe_tp == 1:  # every rank its own experts: the EP group is the whole group
        _EP, _MOE_TP = _TP, TPGroup(device=_TP.device)
        return
    timeout = timedelta(seconds=timeout_s)
    ep_ranks, moe_tp_ranks = ep_layout(rank, size, ep_size)
    for t in range(moe_tp):
        g = dist.new_group(list(range(t, size, moe_tp)), timeout=timeout)
        if t == rank % moe_tp:
            _EP = TPGroup(ep_ranks.index(rank), ep_size, g, _TP.device, None)
    for e in range(ep_size):
        g = dist.new_group(list(range(e * moe_tp, (e + 1) * moe_tp)), timeout=timeout)
        if e == rank // moe_tp:
            _MOE_TP = TPGroup(moe_tp_ranks.index(rank), moe_tp, g, _TP.device, None)


def destroy_tp_group() -> None:
    """Leave the group (if any) and return to the trivial one."""
    global _TP, _EP, _MOE_TP
    _EP = _MOE_TP = None
    from .custom_all_reduce import uninstall_all  # its buffers go with the group

    uninstall_all()
    if _TP.size > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _TP = dataclasses.replace(TPGroup(), device=_TP.device)


def set_tp_group_for_test(group: TPGroup) -> None:
    """Pretend to be ``group.rank`` of ``group.size`` without a process group (shape-level
    tests of the parallel layers build one rank's shard in one process)."""
    global _TP, _EP, _MOE_TP
    _TP, _EP, _MOE_TP = group, None, None

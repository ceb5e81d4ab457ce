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

Pipeline parallelism (``pp_size`` > 1, ``pipeline.py``): the process group holds ``pp_size x
tp_size`` ranks (the *world*); the TP group (and its EP subgroups) is the ``tp_size`` ranks of
this rank's stage. The scheduler's collectives (message broadcast, sampled ids, KV sizing,
idle check) span the world (``get_world_group``; the TP group itself at pp_size 1).
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
_WORLD: TPGroup | None = None  # pp: every rank of every stage; None: the TP group itself
_PP = (0, 1)  # pp: (this rank's stage, pp_size)


def get_tp_group() -> TPGroup:
    return _TP


def tp_rank() -> int:
    return _TP.rank


def tp_size() -> int:
    return _TP.size


def get_ep_group() -> TPGroup:
    """The ranks that split the experts (rank 0 of 1 without expert parallelism)."""
    return _EP if _EP is not None else TPGroup(device=_TP.device)


def get_world_group() -> TPGroup:
    """pp: every rank of the engine (the TP group at pp_size 1): what the scheduler's
    lockstep collectives span."""
    return _WORLD if _WORLD is not None else _TP


def pp_place() -> tuple[int, int]:
    """pp: (this rank's pipeline stage, pp_size); (0, 1) without pipeline parallelism."""
    return _PP


def stage_ranks(stage: int, pp_size: int, tp_size: int) -> list[int]:
    """pp: the global ranks of pipeline stage ``stage``. NOTE: the last stage holds rank 0 (it
    samples, and rank 0's outputs need the logits: logprobs), so stages count down from the
    last: rank r is on stage ``pp_size - 1 - r // tp_size``, TP rank ``r % tp_size``."""
    first = (pp_size - 1 - stage) * tp_size
    return list(range(first, first + tp_size))


def get_moe_tp_group() -> TPGroup:
    """The ranks that hold the same experts and split their intermediate dim."""
    return _MOE_TP if _MOE_TP is not None else _TP


def ep_layout(rank: int, size: int, ep_size: int) -> tuple[list[int], list[int]]:
    """(this rank's EP group, its MoE-TP group): global ranks, in group-rank order."""
    moe_tp = size // ep_size
    first = rank - rank % moe_tp
    return list(range(rank % moe_tp, size, moe_tp)), list(range(first, first + moe_tp))


def init_tp_group(rank: int, size: int, device: torch.device, init_method: str,
                  timeout_s: float = 600.0, ep_size: int = 1, pp_size: int = 1) -> TPGroup:
    """Join the ``size``-rank group at ``init_method`` (``tcp://host:port``) as ``rank``.

    The device group uses NCCL on CUDA and gloo on CPU; a second gloo group carries objects.
    ``timeout_s`` bounds how long a collective may wait for a missing rank (start-up included).
    ``ep_size`` > 1 also forms the expert-parallel subgroups (see the module docstring).
    ``pp_size`` > 1: ``size`` counts every stage's ranks; the TP group is this stage's."""
    global _TP
    if size % pp_size or (size // pp_size) % ep_size:
        raise ModelLoadError(f"ep_size={ep_size} must divide tp_size={size // pp_size} "
                             f"(and pp_size={pp_size} the {size} ranks)")
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
    if pp_size > 1:  # pp: the world stays for the scheduler, the TP group becomes the stage's
        _init_stage_groups(pp_size, backend, timeout_s)
    if ep_size > 1:
        _init_ep_groups(ep_size, timeout_s)
    return _TP


def _init_stage_groups(pp_size: int, backend: str, timeout_s: float) -> None:
    """pp: one TP group per stage (every rank creates all of them, in the same order)."""
    global _TP, _WORLD, _PP
    import torch.distributed as dist

    world, timeout = _TP, timedelta(seconds=timeout_s)
    tp = world.size // pp_size
    stage = pp_size - 1 - world.rank // tp
    _WORLD, _PP = world, (stage, pp_size)
    _TP = TPGroup(device=world.device)
    for s in range(pp_size):
        ranks = stage_ranks(s, pp_size, tp)
        if tp == 1:
            continue  # a one-rank stage: the trivial TP group (no collectives)
        g = dist.new_group(ranks, timeout=timeout)
        cg = g if backend == "gloo" else dist.new_group(ranks, backend="gloo", timeout=timeout)
        if s == stage:
            _TP = TPGroup(ranks.index(world.rank), tp, g, world.device, cg)


def _init_ep_groups(ep_size: int, timeout_s: float) -> None:
    """Every rank creates every subgroup, in the same order (torch.distributed requires it),
    and keeps the two it belongs to. pp: each stage's TP group has its own subgroups (global
    ranks offset by the stage's first rank), created for every stage by every rank."""
    global _EP, _MOE_TP
    import torch.distributed as dist

    rank, size = _TP.rank, _TP.size
    moe_tp = size // ep_size
    if moe_tp == 1:  # every rank its own experts: the EP group is the whole group
        _EP, _MOE_TP = _TP, TPGroup(device=_TP.device)
        return
    timeout = timedelta(seconds=timeout_s)
    ep_ranks, moe_tp_ranks = ep_layout(rank, size, ep_size)
    stage, pp_size = _PP
    for s in range(pp_size):
        base = stage_ranks(s, pp_size, size)[0]  # pp: 0 without pipeline parallelism
        for t in range(moe_tp):
            g = dist.new_group([base + r for r in range(t, size, moe_tp)], timeout=timeout)
            if s == stage and t == rank % moe_tp:
                _EP = TPGroup(ep_ranks.index(rank), ep_size, g, _TP.device, None)
        for e in range(ep_size):
            g = dist.new_group([base + r for r in range(e * moe_tp, (e + 1) * moe_tp)],
                               timeout=timeout)
            if s == stage and e == rank // moe_tp:
                _MOE_TP = TPGroup(moe_tp_ranks.index(rank), moe_tp, g, _TP.device, None)


def destroy_tp_group() -> None:
    """Leave the group (if any) and return to the trivial one."""
    global _TP, _EP, _MOE_TP, _WORLD, _PP
    _EP = _MOE_TP = None
    from .custom_all_reduce import uninstall_all  # its buffers go with the group

    uninstall_all()
    if get_world_group().size > 1:  # pp: every stage
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _TP = dataclasses.replace(TPGroup(), device=_TP.device)
    _WORLD, _PP = None, (0, 1)  # pp:


def set_tp_group_for_test(group: TPGroup) -> None:
    """Pretend to be ``group.rank`` of ``group.size`` without a process group (shape-level
    tests of the parallel layers build one rank's shard in one process)."""
    global _TP, _EP, _MOE_TP, _WORLD, _PP
    _TP, _EP, _MOE_TP, _WORLD, _PP = group, None, None, None, (0, 1)

"""Collectives over this process's tensor-parallel group (``state.get_tp_group``): the only
place the model and the scheduler call torch.distributed.

All are no-ops at size 1, and with no process group (a shape-level test that builds one rank's
shard in one process: it combines the partial results itself). The tensor collectives take an
optional ``group`` (a ``state.TPGroup``: the expert-parallel subgroups, ``get_ep_group`` /
``get_moe_tp_group``); default: the TP group.

pp: the scheduler's collectives (``broadcast`` of the sampled ids, the object broadcasts,
``gather_object``, ``barrier``, ``min_over_ranks``) span every rank of every pipeline stage
(``state.get_world_group``; the TP group at pp_size 1), so all schedulers stay in lockstep.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from . import custom_all_reduce
from .state import TPGroup, get_tp_group, get_world_group


def all_reduce(x: torch.Tensor, group: TPGroup | None = None) -> torch.Tensor:
    """Sum ``x`` over the ranks; returns the sum (``x`` itself, reduced in place, on NCCL/gloo;
    a new tensor from the custom all-reduce: callers use the return value)."""
    g = group or get_tp_group()
    if g.size == 1 or g.group is None:
        return x
    fast = custom_all_reduce.lookup(g)
    if fast is not None and fast.can_run(x):
        return fast.all_reduce(x)
    import torch.distributed as dist

    dist.all_reduce(x, group=g.group)
    return x


def all_reduce_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float, group: TPGroup | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``s = sum(x) + residual``; ``(rmsnorm(s) * weight, s)`` in one kernel where the custom
    all-reduce fuses it (decode-sized ``x [rows, hidden]`` on NVLink); None elsewhere (the
    caller all-reduces, then norms)."""
    g = group or get_tp_group()
    if g.size == 1 or g.group is None or not x.is_cuda:
        return None
    fast = custom_all_reduce.lookup(g)
    return None if fast is None else fast.all_reduce_add_rmsnorm(x, residual, weight, eps)


def all_gather(x: torch.Tensor, dim: int = -1, group: TPGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    g = group or get_tp_group()
    if g.size == 1 or g.group is None:
        return x
    import torch.distributed as dist

    x = x.contiguous()
    flat = torch.empty((g.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    # NOTE: newer torch renamed all_gather_into_tensor (and warns on the old name)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(flat, x, group=g.group)
    out = flat.view(g.size, *x.shape)
    dim = dim % x.dim()
    # [size, ..., d, ...] -> [..., size * d, ...]
    return out.movedim(0, dim).reshape(*x.shape[:dim], g.size * x.shape[dim], *x.shape[dim + 1:])


def all_to_all(x: torch.Tensor, send_splits: list[int] | None, recv_splits: list[int] | None,
               group: TPGroup | None = None) -> torch.Tensor:
    """Rows of ``x`` to every rank: the first ``send_splits[0]`` rows to rank 0, the next to rank
    1, ...; returns the rows every rank sent here, in rank order (``sum(recv_splits)`` rows).
    None splits: equal ones (``x.shape[0]`` divisible by the group size), which need no host
    values and so can be captured in a CUDA graph."""
    g = group or get_tp_group()
    if g.size == 1 or g.group is None:
        return x
    import torch.distributed as dist

    x = x.contiguous()
    rows = sum(recv_splits) if recv_splits is not None else x.shape[0]
    out = torch.empty((rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x, output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=g.group)
    return out


def exchange_counts(counts: torch.Tensor, group: TPGroup | None = None) -> torch.Tensor:
    """``counts [size]`` (how many rows this rank sends to each rank) -> how many each rank
    sends here: the split sizes of a variable ``all_to_all``, exchanged before it."""
    return all_to_all(counts, None, None, group)


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite ``x`` on every rank with rank ``src``'s ``x`` (in place, on the device)."""
    g = get_world_group()  # pp: every stage
    if g.size == 1 or g.group is None:
        return x
    import torch.distributed as dist

    dist.broadcast(x, src=src, group=g.group)
    return x


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank (over the host-side gloo group)."""
    g = get_world_group()  # pp: every stage
    if g.size == 1 or g.cpu_group is None:
        return obj
    import torch.distributed as dist

    box = [obj if g.rank == src else None]
    dist.broadcast_object_list(box, src=src, group=g.cpu_group)
    return box[0]


def broadcast_list(items: list[Any] | None, src: int = 0) -> list[Any]:
    """Rank ``src``'s list of picklable items on every rank. An empty list costs one small
    broadcast (the common case: the scheduler's loop broadcasts its new messages every step)."""
    g = get_world_group()  # pp: every stage
    if g.size == 1 or g.cpu_group is None:
        return list(items or [])
    import pickle

    import torch.distributed as dist

    payload = pickle.dumps(items) if g.rank == src and items else b""
    size = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(size, src=src, group=g.cpu_group)
    if size.item() == 0:
        return []
    buf = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if g.rank == src
           else torch.empty(int(size.item()), dtype=torch.uint8))
    dist.broadcast(buf, src=src, group=g.cpu_group)
    return items if g.rank == src else pickle.loads(buf.numpy().tobytes())


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on ``dst``; None on the other ranks."""
    g = get_world_group()  # pp: every stage
    if g.size == 1 or g.cpu_group is None:
        return [obj]
    import torch.distributed as dist

    out = [None] * g.size if g.rank == dst else None
    dist.gather_object(obj, out, dst=dst, group=g.cpu_group)
    return out


def barrier(timeout_s: float | None = None) -> None:
    """Wait until every rank got here (host side). With ``timeout_s``, rank 0 raises after that
    long naming the ranks that did not arrive (gloo's monitored barrier)."""
    g = get_world_group()  # pp: every stage
    if g.size == 1 or g.cpu_group is None:
        return
    import torch.distributed as dist

    if timeout_s is None:
        dist.barrier(group=g.cpu_group)
    else:
        dist.monitored_barrier(group=g.cpu_group, timeout=timedelta(seconds=timeout_s),
                               wait_all_ranks=True)


def min_over_ranks(value: int) -> int:
    """The smallest of every rank's ``value`` (host side), e.g. KV slots sized from each
    device's free memory: every rank must size its pools the same to schedule the same."""
    g = get_world_group()  # pp: every stage
    if g.size == 1 or g.cpu_group is None:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=g.cpu_group)
    return int(t.item())

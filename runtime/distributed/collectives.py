"""Collectives over this process's tensor-parallel group (``state.get_tp_group``): the only
place the model and the scheduler call torch.distributed.

All are no-ops at size 1, and with no process group (a shape-level test that builds one rank's
shard in one process: it combines the partial results itself).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from .state import get_tp_group


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the ranks, in place; returns ``x``."""
    g = get_tp_group()
    if g.size == 1 or g.group is None:
        return x
    import torch.distributed as dist

    dist.all_reduce(x, group=g.group)
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    g = get_tp_group()
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


def broadcast(x: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite ``x`` on every rank with rank ``src``'s ``x`` (in place, on the device)."""
    g = get_tp_group()
    if g.size == 1 or g.group is None:
        return x
    import torch.distributed as dist

    dist.broadcast(x, src=src, group=g.group)
    return x


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank (over the host-side gloo group)."""
    g = get_tp_group()
    if g.size == 1 or g.cpu_group is None:
        return obj
    import torch.distributed as dist

    box = [obj if g.rank == src else None]
    dist.broadcast_object_list(box, src=src, group=g.cpu_group)
    return box[0]


def broadcast_list(items: list[Any] | None, src: int = 0) -> list[Any]:
    """Rank ``src``'s list of picklable items on every rank. An empty list costs one small
    broadcast (the common case: the scheduler's loop broadcasts its new messages every step)."""
    g = get_tp_group()
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
    g = get_tp_group()
    if g.size == 1 or g.cpu_group is None:
        return [obj]
    import torch.distributed as dist

    out = [None] * g.size if g.rank == dst else None
    dist.gather_object(obj, out, dst=dst, group=g.cpu_group)
    return out


def barrier(timeout_s: float | None = None) -> None:
    """Wait until every rank got here (host side). With ``timeout_s``, rank 0 raises after that
    long naming the ranks that did not arrive (gloo's monitored barrier)."""
    g = get_tp_group()
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
    g = get_tp_group()
    if g.size == 1 or g.cpu_group is None:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=g.cpu_group)
    return int(t.item())

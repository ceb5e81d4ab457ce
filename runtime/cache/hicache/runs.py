"""Runs of slot ids: how the plain-copy path of ``KVTransfer`` cuts a move into contiguous
copies (host runs; stretches contiguous in both pools, copied pool to pool)."""
from __future__ import annotations

import torch

_EMPTY = torch.empty(0, dtype=torch.int64)


def runs(slots: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(offset in slots, first slot, length)`` of each contiguous ascending run."""
    n = int(slots.numel())
    if n == 0:
        return []
    cuts = (torch.nonzero(slots[1:] - slots[:-1] != 1).flatten() + 1).tolist()
    starts, ends = [0, *cuts], [*cuts, n]
    first = slots[starts].tolist()
    return [(s, f, e - s) for s, e, f in zip(starts, ends, first)]


def pair_runs(a: torch.Tensor, b: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """``(offset, first of a, first of b, length)`` of each stretch where ``a`` and ``b`` both
    ascend by one (slot ids of the same tokens in two pools)."""
    n = int(a.numel())
    if n == 0:
        return []
    step = (a[1:] - a[:-1] != 1) | (b[1:] - b[:-1] != 1)
    cuts = (torch.nonzero(step).flatten() + 1).tolist()
    starts, ends = [0, *cuts], [*cuts, n]
    return [(s, x, y, e - s) for s, e, x, y in zip(starts, ends, a[starts].tolist(),
                                                    b[starts].tolist())]


def split(src: torch.Tensor, dst: torch.Tensor, least: int | None
          ) -> tuple[list[tuple[int, int, int]], torch.Tensor, torch.Tensor]:
    """The stretches of at least ``least`` tokens (None: none) to copy pool to pool, as
    ``(first of src, first of dst, length)``, and the other tokens' ``src``/``dst`` slots."""
    if least is None:
        return [], src, dst
    stretches = pair_runs(src, dst)
    direct = [(x, y, m) for _, x, y, m in stretches if m >= least]
    if len(direct) == len(stretches):
        return direct, _EMPTY, _EMPTY
    lengths = torch.tensor([m for *_, m in stretches])
    rest = (lengths < least).repeat_interleave(lengths)
    return direct, src[rest], dst[rest]

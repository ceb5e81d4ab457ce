"""SlotFreeList: the O(1) allocator of KV slot ids that the device pool (``pool.TokenKVPool``)
and the host pool (``host_pool.HostKVPool``) share.

The free ids live in an int64 CPU tensor used as a stack: ``alloc`` takes the top ``n`` (one
slice copy), ``free`` pushes ids back. Ids freed together are allocated together again, so a
request's or a radix node's slots stay mostly in a few contiguous runs.
"""
from __future__ import annotations

import torch


class SlotFreeList:
    def __init__(self, first: int, count: int) -> None:
        """The ids ``first .. first + count - 1``, all free."""
        self.first, self.count = first, count
        self._ids = torch.arange(first, first + count, dtype=torch.int64)
        self._num_free = count

    def available(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n`` free ids as an int64 CPU tensor, or None if fewer than ``n`` are free."""
        if n > self._num_free:
            return None
        start = self._num_free - n
        out = self._ids[start:self._num_free].clone()
        self._num_free = start
        return out

    def free(self, ids: torch.Tensor, what: str) -> None:
        n = int(ids.numel())
        if n == 0:
            return
        end = self._num_free + n
        assert end <= self.count, f"freeing more {what} than exist (double free?)"
        self._ids[self._num_free:end] = ids.to("cpu", torch.int64)
        self._num_free = end

    def free_ids(self) -> torch.Tensor:
        """The free ids (a view: valid until the next alloc or free)."""
        return self._ids[: self._num_free]

    def sort(self) -> None:
        """Sort the free ids, so the next allocations are few contiguous runs."""
        self._ids[: self._num_free] = self.free_ids().sort().values

    def check(self, what: str) -> None:
        free = self.free_ids()
        assert free.unique().numel() == self._num_free, f"duplicate slot in the {what} free list"
        assert bool(((free >= self.first) & (free < self.first + self.count)).all()), (
            f"slot out of range in the {what} free list")

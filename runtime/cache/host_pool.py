"""HostKVPool: the hierarchical cache's second tier, KV buffers in host memory.

It mirrors ``TokenKVPool``'s layout per layer (one K and one V buffer ``[slots, kv_heads,
head_dim]`` in the device pool's dtype, fp8 included) so a token's KV moves between the tiers
as whole rows, with no conversion. On CUDA the buffers are page-locked (pinned): the KV move
kernel reads and writes them over UVA (hicache/kernel_io.py); on the CPU they are plain memory.
Slot ids run 0..size-1 (no dummy row: no padding token is ever written here). The allocator
is an O(1) free list over an int tensor, like the device pool's; allocations take the top of
the list, so a node's slots are mostly a few contiguous runs (``defragment`` sorts the list
after the tree frees many).
"""
from __future__ import annotations

import math
import weakref

import torch

from .free_list import SlotFreeList
from .pool import TokenKVPool, _raw

GB = 1 << 30


class HostKVPool:
    def __init__(self, num_slots: int, device_pool: TokenKVPool, pin_memory: bool) -> None:
        self.size = num_slots
        self.dtype = device_pool.dtype
        self.num_layers = device_pool.num_layers
        _, heads, head_dim = device_pool.k_buffer[0].shape
        self.row_shape = (heads, head_dim)
        # NOTE: zeros, not empty: a bug that reads an unwritten host row then gives zeros, never
        # another request's stale KV.
        shape = (self.num_layers, 2, num_slots, heads, head_dim)
        self._store = _pinned_zeros(shape, self.dtype) if pin_memory else torch.zeros(
            shape, dtype=self.dtype)
        # NOTE: what the CUDA runtime says about the buffers (a registered pool must read True,
        # or every copy would be a pageable one: synchronous for the host): in the stats
        self.pinned = bool(pin_memory and self._store.is_pinned())
        self.k_buffer = [self._store[layer, 0] for layer in range(self.num_layers)]
        self.v_buffer = [self._store[layer, 1] for layer in range(self.num_layers)]
        self.bytes_per_token = TokenKVPool.bytes_per_token(self.num_layers, heads, head_dim,
                                                           self.dtype)
        self.free_list = SlotFreeList(0, num_slots)

    @staticmethod
    def num_slots(device_pool: TokenKVPool, ratio: float, size_gb: float | None) -> int:
        """Host slots for ``hicache_size`` GB (when set) or ``hicache_ratio`` x device slots."""
        if size_gb:
            _, heads, head_dim = device_pool.k_buffer[0].shape
            per_token = TokenKVPool.bytes_per_token(device_pool.num_layers, heads, head_dim,
                                                    device_pool.dtype)
            return int(size_gb * GB) // per_token
        return int(device_pool.size * ratio)

    def available(self) -> int:
        return self.free_list.available()

    def alloc(self, n: int) -> torch.Tensor | None:
        return self.free_list.alloc(n)

    def free(self, slots: torch.Tensor) -> None:
        self.free_list.free(slots, "host KV slots")

    def defragment(self) -> None:
        """Sort the free list, so the next allocations are few contiguous runs of slots (each
        run moves as one copy per layer: transfer.py)."""
        self.free_list.sort()

    # -- rows as one tensor [layers, 2, n, heads, head_dim] (storage pages, staging) ----------
    def gather(self, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The KV rows at ``slots``, every layer, as one ``[L, 2, n, H, D]`` tensor (raw bytes
        for fp8)."""
        n = int(slots.numel())
        if out is None:
            out = torch.empty((self.num_layers, 2, n, *self.row_shape), dtype=self.raw_dtype)
        for layer in range(self.num_layers):
            torch.index_select(_raw(self.k_buffer[layer]), 0, slots, out=out[layer, 0])
            torch.index_select(_raw(self.v_buffer[layer]), 0, slots, out=out[layer, 1])
        return out

    def scatter(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write ``rows`` (``gather``'s shape) at ``slots``."""
        for layer in range(self.num_layers):
            _raw(self.k_buffer[layer]).index_copy_(0, slots, rows[layer, 0])
            _raw(self.v_buffer[layer]).index_copy_(0, slots, rows[layer, 1])

    @property
    def raw_dtype(self) -> torch.dtype:
        return _raw(torch.empty(0, dtype=self.dtype)).dtype

    def check_integrity(self) -> None:
        self.free_list.check("host KV")


# Below this a pool comes from torch's pinned allocator (its power-of-two rounding costs little
# there); above it, malloc maps the buffer on pages of its own, which are page-locked in place.
SMALL_PIN_BYTES = 64 << 20


def _pinned_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed page-locked tensor. NOTE: not ``pin_memory=True`` for large pools: torch's pinned
    allocator rounds every block up to a power of two, up to ~2x the host memory asked for. Small
    ones use it: a small heap block shares pages with other blocks, and registering pages that
    an earlier (since freed) pool registered fails ("already mapped", seen on the GPU tests)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes < SMALL_PIN_BYTES:
        return torch.zeros(shape, dtype=dtype, pin_memory=True)
    t = torch.zeros(shape, dtype=dtype)
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(t.data_ptr(), nbytes, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of the {nbytes / GB:.1f} GB host KV pool failed "
                           f"({err}); lower hicache_size/hicache_ratio")
    # unregistered when the pool's memory goes, so that a later pool may reuse the pages
    weakref.finalize(t, cudart.cudaHostUnregister, t.data_ptr())
    return t

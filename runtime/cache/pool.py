"""KV memory: the request->token table and the token-level KV buffers.

``ReqToTokenPool.req_to_token[r, p]`` is the KV slot holding position ``p`` of the request in
row ``r``. ``TokenKVPool`` owns one K and one V buffer per layer, ``[num_slots, kv_heads, head_dim]``.
Slot 0 is reserved as a dummy that padded (CUDA-graph) rows write to, so it is never handed out.
Both allocators are O(1) amortized free lists over int tensors kept on the CPU.
"""
from __future__ import annotations

import torch


class ReqToTokenPool:
    """Rows of the request->slot table, one per running request."""

    def __init__(self, max_requests: int, max_context_len: int, device: torch.device | str) -> None:
        self.size = max_requests
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((max_requests, max_context_len), dtype=torch.int64,
                                        device=device)
        self._free: list[int] = list(range(max_requests - 1, -1, -1))

    def available(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        # NOTE: rows are not zeroed; a row is only read up to its owner's seq_len.
        self._free.append(row)

    def check_integrity(self) -> None:
        assert len(set(self._free)) == len(self._free), "double free in ReqToTokenPool"
        assert all(0 <= r < self.size for r in self._free)


class TokenKVPool:
    """Token-granular KV buffers plus a free list of slot indices (1..num_slots)."""

    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.size = num_slots  # usable slots; buffers hold num_slots + 1 rows (row 0 = dummy)
        self.num_layers = num_layers
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (num_slots + 1, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._free = torch.arange(1, num_slots + 1, dtype=torch.int64)
        self._num_free = num_slots

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def available(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        """n free slots as an int64 CPU tensor, or None if fewer than n are free."""
        if n > self._num_free:
            return None
        start = self._num_free - n
        out = self._free[start:self._num_free].clone()
        self._num_free = start
        return out

    def free(self, slots: torch.Tensor) -> None:
        n = int(slots.numel())
        if n == 0:
            return
        end = self._num_free + n
        assert end <= self.size, "freeing more KV slots than exist (double free?)"
        self._free[self._num_free:end] = slots.to("cpu", torch.int64)
        self._num_free = end

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)

    def check_integrity(self) -> None:
        free = self._free[: self._num_free]
        assert free.unique().numel() == self._num_free, "duplicate slot in KV free list"
        assert bool(((free >= 1) & (free <= self.size)).all()), "slot out of range in free list"

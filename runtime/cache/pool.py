"""KV memory: the request->token table and the token-level KV buffers.

``ReqToTokenPool.req_to_token[r, p]`` is the KV slot holding position ``p`` of the request in
row ``r``. ``TokenKVPool`` owns one K and one V buffer per layer, ``[num_slots, kv_heads, head_dim]``,
in the model dtype or in fp8 (E4M3) with one K and one V scale per layer (stored = value / scale;
1.0 unless the checkpoint provides calibrated scales).
Slot 0 is reserved as a dummy that padded (CUDA-graph) rows write to, so it is never handed out.
Both allocators are O(1) amortized free lists over int tensors kept on the CPU.
"""
from __future__ import annotations

import torch

from .free_list import SlotFreeList

FP8_MAX = 448.0  # largest finite float8_e4m3fn (it has no inf: overflow would be NaN)


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
        self.quantized = dtype == torch.float8_e4m3fn
        self.k_scale = [1.0] * num_layers
        self.v_scale = [1.0] * num_layers
        self.free_list = SlotFreeList(1, num_slots)  # slot 0: the dummy row
        # hicache: per-layer events of host->device loads in flight (None: none), see wait_layer
        self._layer_events: list | None = None

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def available(self) -> int:
        return self.free_list.available()

    def alloc(self, n: int) -> torch.Tensor | None:
        """n free slots as an int64 CPU tensor, or None if fewer than n are free."""
        return self.free_list.alloc(n)

    def free(self, slots: torch.Tensor) -> None:
        self.free_list.free(slots, "KV slots")

    def set_scales(self, scales: dict[int, tuple[float, float]]) -> None:
        """Per-layer (k_scale, v_scale) of an fp8 cache (e.g. from the checkpoint); a cache in
        the model dtype stores values as they are, so its scales stay 1."""
        for layer, (k, v) in scales.items():
            if not (k > 0 and v > 0):
                raise ValueError(f"layer {layer}: KV scales must be positive, got {k}, {v}")
            if self.quantized:
                self.k_scale[layer], self.v_scale[layer] = float(k), float(v)

    def store(self, layer_id: int, which: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` as stored in the cache: the dtype, and for fp8 divided by the layer's scale."""
        if not self.quantized:
            return x.to(self.dtype)
        scale = (self.k_scale if which == "k" else self.v_scale)[layer_id]
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(self.dtype)

    def load(self, layer_id: int, which: str, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Stored cache values back in ``dtype`` (the inverse of ``store``)."""
        if not self.quantized:
            return x.to(dtype)
        scale = (self.k_scale if which == "k" else self.v_scale)[layer_id]
        return (x.float() * scale).to(dtype)

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new tokens' k/v ``[n, kv_heads, head_dim]`` at slots ``loc``."""
        for buf, x, which in ((self.k_buffer, k, "k"), (self.v_buffer, v, "v")):
            _raw(buf[layer_id]).index_copy_(0, loc, _raw(self.store(layer_id, which, x)))

    def read(self, layer_id: int, slots: torch.Tensor, dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """k/v at ``slots`` (any shape of slot ids, flattened) in ``dtype``."""
        k = _raw(self.k_buffer[layer_id]).index_select(0, slots).view(self.dtype)
        v = _raw(self.v_buffer[layer_id]).index_select(0, slots).view(self.dtype)
        return self.load(layer_id, "k", k, dtype), self.load(layer_id, "v", v, dtype)

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.write(layer_id, loc, k, v)

    # hicache: layer-wise overlap of host->device loads with the prefill that reads them
    def await_layers(self, events: list) -> None:
        """A load was queued on a side stream with ``events[i]`` recorded after layer ``i``'s
        copies: attention's next read of layer ``i`` waits for it (``wait_layer``)."""
        if events:
            # NOTE: loads whose copies have all landed need no wait any more (dropped here, so
            # the list stays as short as the loads in flight)
            live = [e for e in self._layer_events or []
                    if any(x is not None and not x.query() for x in e)]
            self._layer_events = [*live, list(events)]

    def wait_layer(self, layer_id: int) -> None:
        """Attention backends call this before reading layer ``layer_id``'s buffers: the
        compute stream waits (on the device; the host does not) for that layer of every load
        queued since, and only that layer."""
        loads = self._layer_events
        if loads is None:
            return
        stream = torch.cuda.current_stream(self.device)
        for events in loads:
            if events[layer_id] is not None:
                stream.wait_event(events[layer_id])
                events[layer_id] = None  # the compute stream is past it: later reads need none
        if layer_id == len(loads[0]) - 1:  # the last layer: loads waited for in full go
            self._layer_events = [e for e in loads if any(x is not None for x in e)] or None

    # pd: the buffers as stored (fp8 as bytes), for disaggregation's KV transfer
    def page_buffers(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_id``'s K and V buffers ``[slots, kv_heads, head_dim]`` as stored."""
        return _raw(self.k_buffer[layer_id]), _raw(self.v_buffer[layer_id])

    def check_integrity(self) -> None:
        self.free_list.check("KV")


def _raw(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors as bytes: CPU index_copy_/index_select have no fp8 kernels."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

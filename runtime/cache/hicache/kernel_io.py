"""KernelIO: moves of KV rows between a CUDA device pool and its page-locked host pool as a few
kernel launches (``kernels/kv_move.py``) instead of a copy per layer, K/V and contiguous run.

A load is one launch per layer (the caller records an event after each: attention's layer ``i``
waits for event ``i`` only, SGLang's layer-wise overlap) and a backup one launch for every
layer. The slot ids go to the device as one ``[2, n]`` tensor (device slots, host slots); the
kernel gathers and scatters the rows itself, reading or writing host memory over UVA, so
scattered host slots cost no more launches than contiguous ones (no runs, no staging).

``create`` returns None where this cannot run, and the transfer keeps its plain copies: a CPU
pool, a host pool the CUDA runtime does not see as page-locked, no Triton, a launcher that
refuses the host pointer, or ``hicache_io_backend="direct"`` (SGLang's option and values:
``kernel``, the default, or ``direct``: copies).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from ..host_pool import HostKVPool
from ..pool import TokenKVPool, _raw

logger = logging.getLogger(__name__)

# NOTE: layers per launch of a load. 1: the finest overlap (attention's layer i waits for layer
# i's copy only) at one launch per layer; g: 1/g of the launches, and layer i waits for its
# group of g (bench_kv_move.py --load-group measures the issue time of each).
LOAD_LAYERS_PER_LAUNCH = 1


class KernelIO:
    def __init__(self, dev: TokenKVPool, host: HostKVPool) -> None:
        from ...kernels import kv_move

        self._move = kv_move.move_rows
        row_bytes = _raw(dev.k_buffer[0][:1]).nbytes
        self.word = kv_move.word_dtype(row_bytes)
        self.row_words = row_bytes // self.word.itemsize
        self.layers = dev.num_layers
        self.load_group = LOAD_LAYERS_PER_LAUNCH
        self.host_words = kv_move.as_words(host._store, self.word)
        self.host_plane_words = host.size * self.row_words  # one layer's K (or V) in the host
        planes = [b for layer in range(self.layers) for b in (dev.k_buffer[layer],
                                                              dev.v_buffer[layer])]
        # NOTE: the kernel addresses device rows from these (the buffers are separate
        # allocations); the buffers live as long as the pool, and the pool outlives this
        self._dev_buffers = [kv_move.as_words(_raw(b), self.word) for b in planes]
        ptrs = [b.data_ptr() for b in self._dev_buffers]
        assert all(p % 16 == 0 for p in ptrs), "the kernel assumes 16-byte aligned buffers"
        self.dev_ptrs = torch.tensor(ptrs, dtype=torch.int64).to(dev.device)

    @classmethod
    def create(cls, dev: TokenKVPool, host: HostKVPool, backend: str = "kernel"
               ) -> KernelIO | None:
        """The kernel path for these pools, or None (see the module docstring)."""
        if backend != "kernel" or dev.device.type != "cuda" or not host.pinned:
            return None
        try:
            io = cls(dev, host)
            io.probe()
        except Exception as err:  # noqa: BLE001  NOTE: whatever refuses it, the copies work
            logger.warning("hicache: KV move kernel unavailable (%r): plain copies", err)
            return None
        return io

    def probe(self) -> None:
        """One row each way, host row 0 (zeros: no node holds it yet) into the device's dummy
        row 0 and back, so neither pool keeps a trace: compiles both kernels and lets a
        launcher that refuses the host pointer raise here, not in the middle of a load."""
        idx = torch.zeros((2, 1), dtype=torch.int64, device=self.dev_ptrs.device)
        self.load(idx, lambda: None)
        self.backup(idx)
        torch.cuda.synchronize(self.dev_ptrs.device)

    def backup(self, idx: torch.Tensor) -> None:
        """Host rows ``idx[1]`` <- device rows ``idx[0]``, every layer, one launch."""
        self._move(self.host_words, self.dev_ptrs, idx[0], idx[1], (0, 2 * self.layers),
                   self.row_words, self.host_plane_words, to_host=True)

    def load(self, idx: torch.Tensor, after_layer: Callable[[], object]) -> list:
        """Device rows ``idx[0]`` <- host rows ``idx[1]``, one launch per ``load_group`` layers;
        returns, per layer, what ``after_layer()`` gave after its group's launch (its event)."""
        marks: list = []
        dev_idx, host_idx = idx[0], idx[1]
        for first in range(0, self.layers, self.load_group):
            last = min(first + self.load_group, self.layers)
            self._move(self.host_words, self.dev_ptrs, dev_idx, host_idx, (2 * first, 2 * last),
                       self.row_words, self.host_plane_words, to_host=False)
            marks.extend([after_layer()] * (last - first))
        return marks

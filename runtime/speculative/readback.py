"""VerifyRead: a verify step's sampled ids brought to the host by one small copy, read after
the host did what it could while the device runs (the drafter's ``prefetch``).

The ids (one per verified row) are copied into a pinned host buffer kept across steps behind a
CUDA event, and the read waits for that event only. One buffer serves every step: a
speculative step is read before the next one is launched. On the CPU the ids are already the
host tensor.
"""
from __future__ import annotations

import torch


class VerifyRead:
    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.host: torch.Tensor | None = None
        self.event: torch.cuda.Event | None = None
        self.waiting = False

    def start(self, ids: torch.Tensor) -> None:
        """Queue the copy of ``ids`` (behind the work that computes them)."""
        if ids.device.type != "cuda":
            self.host, self.waiting = ids, False
            return
        n = ids.numel()
        if self.buf is None or self.buf.numel() < n or self.buf.dtype != ids.dtype:
            self.buf = torch.empty(max(2 * n, 64), dtype=ids.dtype, pin_memory=True)
        if self.event is None:
            self.event = torch.cuda.Event()
        self.host = self.buf[:n]
        self.host.copy_(ids.view(-1), non_blocking=True)
        self.event.record()
        self.waiting = True

    def wait(self) -> list[int]:
        """The ids, once the copy has landed."""
        if self.waiting:
            self.event.synchronize()
            self.waiting = False
        return self.host.tolist()

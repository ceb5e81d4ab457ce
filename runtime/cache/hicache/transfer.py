"""KVTransfer: moves KV rows between the device pool and the host pool.

On the CPU both pools are plain memory: a copy is an indexed row copy, done at once.

On CUDA copies run on a side stream so the compute stream is not held up:

- device -> host (a backup): the side stream first waits for the compute stream (the rows must
  be written), gathers the rows per layer into a pinned staging tensor and records an event. The
  host pool is written from the staging tensor only when the event has fired (``poll`` or
  ``finish``), so a backup is *pending* until then. The device slots may be freed as soon as the
  gather is queued: ``fence`` makes the compute stream wait for the side stream before any later
  kernel can overwrite them.
- host -> device (a load): the rows are gathered on the host into pinned staging, copied and
  scattered per layer on the side stream; the compute stream waits on its event, so the
  request's prefill is queued behind the load without the host blocking.

NOTE: the whole load finishes before the prefill's first layer runs; a layer-by-layer overlap
would need per-layer waits inside the model's layer loop, which this does not do.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..host_pool import HostKVPool
from ..pool import TokenKVPool, _raw


@dataclass
class _Backup:
    event: Any  # torch.cuda.Event
    staging: torch.Tensor
    host_slots: torch.Tensor
    done: Callable[[], None]
    landed: bool = False


class KVTransfer:
    def __init__(self, device_pool: TokenKVPool, host_pool: HostKVPool) -> None:
        self.dev = device_pool
        self.host = host_pool
        self.cuda = device_pool.device.type == "cuda"
        self.stream = torch.cuda.Stream(device_pool.device) if self.cuda else None
        self.pending: list[_Backup] = []
        self._unfenced = False
        self.bytes_d2h = 0
        self.bytes_h2d = 0
        self.loads = 0
        self.load_seconds = 0.0
        self._timed: list[tuple[Any, Any]] = []  # CUDA: (start, end) events of loads in flight

    # -- device -> host ---------------------------------------------------------------------
    def backup(self, dev_slots: torch.Tensor, host_slots: torch.Tensor,
               done: Callable[[], None]) -> _Backup | None:
        """Copy device rows to host rows; ``done()`` runs once the host rows hold them.
        Returns the pending backup (its ``landed`` turns True then), or None when done."""
        self.bytes_d2h += int(dev_slots.numel()) * self.host.bytes_per_token
        if not self.cuda:
            for layer in range(self.dev.num_layers):
                for d, h in ((self.dev.k_buffer, self.host.k_buffer),
                             (self.dev.v_buffer, self.host.v_buffer)):
                    _raw(h[layer]).index_copy_(0, host_slots, _raw(d[layer]).index_select(0, dev_slots))
            done()
            return None
        staging = torch.empty((self.dev.num_layers, 2, int(dev_slots.numel()), *self.host.row_shape),
                              dtype=self.host.raw_dtype, pin_memory=True)
        main = torch.cuda.current_stream(self.dev.device)
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(main)
            idx = dev_slots.to(self.dev.device, non_blocking=True)
            for layer in range(self.dev.num_layers):
                staging[layer, 0].copy_(_raw(self.dev.k_buffer[layer]).index_select(0, idx),
                                        non_blocking=True)
                staging[layer, 1].copy_(_raw(self.dev.v_buffer[layer]).index_select(0, idx),
                                        non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        backup = _Backup(event, staging, host_slots, done)
        self.pending.append(backup)
        self._unfenced = True
        return backup

    def fence(self) -> None:
        """Before device slots of a just-queued backup are reused: the compute stream waits
        for the side stream's gathers (a device-side wait; the host does not block)."""
        if self._unfenced:
            torch.cuda.current_stream(self.dev.device).wait_stream(self.stream)
            self._unfenced = False

    def poll(self) -> None:
        """Finish the backups whose copies have landed (no waiting); time finished loads."""
        while self.pending and self.pending[0].event.query():
            self._finish_one(self.pending.pop(0))
        while self._timed and self._timed[0][1].query():
            begin, end = self._timed.pop(0)
            self.load_seconds += begin.elapsed_time(end) / 1e3

    def finish(self) -> None:
        """Finish every pending backup (waits for the side stream)."""
        while self.pending:
            backup = self.pending.pop(0)
            backup.event.synchronize()
            self._finish_one(backup)
        for begin, end in self._timed:
            end.synchronize()
            self.load_seconds += begin.elapsed_time(end) / 1e3
        self._timed.clear()

    def _finish_one(self, backup: _Backup) -> None:
        self.host.scatter(backup.host_slots, backup.staging)
        backup.landed = True
        backup.done()

    # -- host -> device ---------------------------------------------------------------------
    def load(self, host_slots: torch.Tensor, dev_slots: torch.Tensor) -> None:
        """Copy host rows into device rows, ahead of anything the compute stream runs next."""
        start = time.perf_counter()
        n = int(host_slots.numel())
        self.bytes_h2d += n * self.host.bytes_per_token
        self.loads += 1
        if not self.cuda:
            for layer in range(self.dev.num_layers):
                for d, h in ((self.dev.k_buffer, self.host.k_buffer),
                             (self.dev.v_buffer, self.host.v_buffer)):
                    _raw(d[layer]).index_copy_(0, dev_slots, _raw(h[layer]).index_select(0, host_slots))
            self.load_seconds += time.perf_counter() - start
            return
        staging = torch.empty((self.dev.num_layers, 2, n, *self.host.row_shape),
                              dtype=self.host.raw_dtype, pin_memory=True)
        self.host.gather(host_slots, out=staging)
        main = torch.cuda.current_stream(self.dev.device)
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(main)
            begin = torch.cuda.Event(enable_timing=True)
            begin.record(self.stream)
            idx = dev_slots.to(self.dev.device, non_blocking=True)
            for layer in range(self.dev.num_layers):
                rows = staging[layer].to(self.dev.device, non_blocking=True)
                _raw(self.dev.k_buffer[layer]).index_copy_(0, idx, rows[0])
                _raw(self.dev.v_buffer[layer]).index_copy_(0, idx, rows[1])
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.stream)
        main.wait_event(event)
        # NOTE: load latency = the host's gather + the copy's time on the side stream (read
        # from the events once they have fired: ``poll``).
        self.load_seconds += time.perf_counter() - start
        self._timed.append((begin, event))

    def stats(self) -> dict[str, float | int]:
        return {"hicache_bytes_device_to_host": self.bytes_d2h,
                "hicache_bytes_host_to_device": self.bytes_h2d,
                "hicache_loads_total": self.loads,
                "hicache_load_seconds_total": self.load_seconds,
                "hicache_load_latency_avg_s": self.load_seconds / self.loads if self.loads else 0.0,
                "hicache_pending_backups": len(self.pending)}

"""KVTransfer: moves KV rows between the device pool and the host pool.

Host rows are addressed as *runs* (contiguous ranges of host slots; a node's slots are mostly a
few runs, see ``HostKVPool.alloc``), so each layer's rows move as a few contiguous copies:
device -> host gathers the device rows into one contiguous tensor and copies each run out;
host -> device copies each run into one contiguous tensor and scatters it into the device
slots. On the CPU that is all; the same code runs with plain copies.

On CUDA (the host pool page-locked, so every run copy is asynchronous DMA) copies run on two
side streams (backups on one, loads round-robin on ``LOAD_STREAMS`` others), never blocking
the host:

- device -> host (a backup, ``write_stream``): first waits for the compute stream (the rows
  must be written). The backup is *pending* until its event fires (``poll``/``finish``); the
  host rows are not read on the CPU before. The device slots may be freed as soon as the copy
  is queued: ``fence(backup event)`` makes the compute stream wait for that backup (only)
  before a later kernel can overwrite them.
- host -> device (a load, on one of the ``load_streams``): first waits for the compute
  stream (the fresh device slots were freed by evictions, and a step in flight may still read
  them, or a backup still gather them: the compute stream was fenced on it) and for the
  backups still filling the host rows it reads (on the device: the host does not wait). Then
  layer by layer, with an event recorded after each layer's copies, handed to the device pool
  (``TokenKVPool.await_layers``): attention's layer ``i`` waits for event ``i`` only
  (``TokenKVPool.wait_layer``), so the prefill's first layers run while later layers are
  still being copied (SGLang's layer-wise overlap), and nothing on the compute stream waits
  for a load before it reaches attention. A decode step that replays a CUDA graph never waits
  (it reads no slot being loaded: only an admitted request's prefill does); slots of a loaded
  node freed before that prefill ran wait for the load first (``fence(load event)``).

On CUDA with a page-locked host pool, every move goes through ``KernelIO`` (kernel_io.py):
the kernel reads and writes the host rows itself over UVA, one launch per layer for a load
(its event after each: the overlap below is unchanged) and one for a backup, whatever the
slots' runs; everything below about runs, pool-to-pool stretches and staging is the plain-copy
path (the CPU, or ``KernelIO.create`` returned None). Measured before it on the H200 chat
benchmark (Llama-3.1-8B): issuing one load took 13.45 ms of the scheduler's time (9.4 ms of
device time), a backup ~7 ms: a launch per layer, K/V and run.

The device slot ids go up through pinned memory (``to_device``, as every upload of the
scheduler): from pageable memory CUDA may stage the copy synchronously, and the side stream
first waits for the step in flight, so the host could wait for that step on every backup and
load.

Where host and device slots are *both* contiguous over a stretch (``pair_runs``: a prefill's
slots are, in both pools), the stretch moves as one copy straight from pool to pool: one pass
over the bytes, with no gather buffer and no scatter (``index_copy_``) kernel. On CUDA only
stretches of at least ``MIN_DIRECT_TOKENS`` go that way (each copy is a launch per layer, K and
V; a decode step gives each running request one slot, so an answer's slots interleave with the
other requests' and come as 1-token stretches): the other tokens take the gathered path below.
CUDA splits a move so only where that takes no more copies per layer than gathering it all
(on the device the gather is cheap: the DMA is the cost either way). On the CPU every stretch
of ``MIN_DIRECT_TOKENS_CPU`` or more goes pool to pool (a 2,048-token load of SmolLM2's KV went
from ~147-214 ms to ~29-32 ms, a plain memcpy's cost); shorter ones gather (a copy call costs
~15 us whatever its size: an answer's 32 one-token stretches took 35-45 ms copied one by one).
SGDSL_HICACHE_DIRECT=0 turns pool-to-pool copies off (A/B: bench_hicache_tiers.py).

Fragmented host slots (more than ``MAX_RUNS`` runs) go through pinned staging instead (a host
gather or scatter, then one copy per layer).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...layers.upload import to_device
from ..host_pool import HostKVPool
from ..pool import TokenKVPool, _raw
from .kernel_io import KernelIO
from .runs import pair_runs, runs, split  # noqa: F401  (pair_runs: tests import it here)

MAX_RUNS = 128  # past this many runs, staging: one host gather beats thousands of tiny copies
# NOTE: loads of one prefill batch go round-robin to this many streams, so the second load's
# first layer is not queued behind the first load's last layer (the prefill's first layer
# waits for the first layer of every load).
LOAD_STREAMS = 4
DIRECT = os.environ.get("SGDSL_HICACHE_DIRECT", "1") != "0"  # pool-to-pool copies (above)
MIN_DIRECT_TOKENS = 16  # CUDA: shorter stretches gather (a launch per layer each otherwise)
# NOTE: on the CPU too: a copy call costs ~15 us, so a finished request's answer (1-token
# stretches: its decode slots interleave with the other requests') copied token by token took
# 35-45 ms for 32 tokens x 32 layers, gathered ~1-2 ms
MIN_DIRECT_TOKENS_CPU = 16
# NOTE: lockstep (several ranks run the same scheduler: TP, PP): a backup counts as landed
# this many scheduler steps after it was issued, on every rank alike (the host waits for it
# then, rarely: by two steps on, the step it followed has been read and the copy ran beside
# the next one). Asking the event instead lets each rank's own copy speed decide which host
# copies may be evicted or stored, and the ranks' trees, then their batches, diverge.
LOCKSTEP_LAG = 2


@dataclass
class _Backup:
    event: Any  # torch.cuda.Event
    staging: torch.Tensor | None  # pinned rows to scatter into the host pool (fragmented case)
    host_slots: torch.Tensor
    done: Callable[[], None]
    landed: bool = False
    tick: int = 0  # ``KVTransfer.ticks`` when it was issued (lockstep: when it counts as landed)


class KVTransfer:
    def __init__(self, device_pool: TokenKVPool, host_pool: HostKVPool, api: Any = None,
                 lockstep: bool = False, io_backend: str = "kernel") -> None:
        """``api``: where streams and events come from (``torch.cuda`` on a CUDA pool; tests
        pass a stand-in to run the CUDA path over CPU pools and count its host waits).
        ``lockstep``: ranks that must keep identical trees (see ``LOCKSTEP_LAG``).
        ``io_backend``: ``kernel`` (``KernelIO`` where it runs) or ``direct`` (copies)."""
        self.lockstep = lockstep
        self.ticks = 0  # scheduler steps (``tick``), the same count on every rank
        self.dev = device_pool
        self.host = host_pool
        self.cuda = api is not None or device_pool.device.type == "cuda"
        self.api = api if api is not None else torch.cuda
        new_stream = (lambda: self.api.Stream(device_pool.device)) if self.cuda else None
        self.write_stream = new_stream() if self.cuda else None  # device -> host
        self.load_streams = [new_stream() for _ in range(LOAD_STREAMS)] if self.cuda else []
        self._turn = 0
        self.pending: list[_Backup] = []
        self._timed: list[tuple[Any, Any]] = []  # CUDA: (start, end) events of loads in flight
        self.bytes_d2h = self.bytes_h2d = self.loads = self.backups = self.direct_moves = 0
        self.load_seconds = 0.0
        # NOTE: host time spent issuing copies: on CUDA if a copy blocks the host (pageable
        # memory, a full queue) it shows here; on the CPU it is the copy itself
        self.load_issue_seconds = self.backup_issue_seconds = 0.0
        # the kernel path (None: plain copies); tests may set one over CPU pools (interpreter)
        self.io = (KernelIO.create(device_pool, host_pool, io_backend)
                   if api is None and self.cuda else None)

    def _plan(self, dev_slots: torch.Tensor, host_slots: torch.Tensor
              ) -> tuple[list, torch.Tensor, torch.Tensor]:
        """``split`` of a move: ``(device first, host first, length)`` stretches to copy pool to
        pool, and the other tokens' device and host slots. On CUDA only if that takes no more
        copies per layer than gathering every token does (each copy is a launch)."""
        least = (MIN_DIRECT_TOKENS if self.cuda else MIN_DIRECT_TOKENS_CPU) if DIRECT else None
        direct, rest_dev, rest_host = split(dev_slots, host_slots, least)
        if self.cuda and direct:
            rest = len(runs(rest_host)) + 1 if rest_host.numel() else 0
            if len(direct) + rest > len(runs(host_slots)) + 1:
                direct, rest_dev, rest_host = [], dev_slots, host_slots
        self.direct_moves += bool(direct)
        return direct, rest_dev, rest_host

    def _pairs(self, layer: int) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """(device buffer, host buffer) of the layer's K and V, as raw rows."""
        return ((_raw(self.dev.k_buffer[layer]), _raw(self.host.k_buffer[layer])),
                (_raw(self.dev.v_buffer[layer]), _raw(self.host.v_buffer[layer])))

    # -- device -> host ---------------------------------------------------------------------
    def backup(self, dev_slots: torch.Tensor, host_slots: torch.Tensor,
               done: Callable[[], None]) -> _Backup | None:
        """Copy device rows to host rows; ``done()`` runs once the host rows hold them.
        Returns the pending backup (its ``landed`` turns True then), or None when done."""
        start = time.perf_counter()
        self.bytes_d2h += int(dev_slots.numel()) * self.host.bytes_per_token
        self.backups += 1
        if self.io is not None:
            with self.api.stream(self.write_stream):
                self.write_stream.wait_stream(self.api.current_stream(self.dev.device))
                self.io.backup(self._slot_pairs(dev_slots, host_slots))
                event = self._mark()
            return self._pending(_Backup(event, None, host_slots, done, tick=self.ticks), start)
        direct, dev_slots, host_slots = self._plan(dev_slots, host_slots)  # the rest: gathered
        parts = runs(host_slots)
        if not self.cuda:
            self._copy_out(direct, dev_slots if parts else None, parts, None)
            self.backup_issue_seconds += time.perf_counter() - start
            done()
            return None
        staging = None
        if len(parts) > MAX_RUNS:
            staging = torch.empty((self.dev.num_layers, 2, int(dev_slots.numel()),
                                   *self.host.row_shape), dtype=self.host.raw_dtype,
                                  pin_memory=True)
        with self.api.stream(self.write_stream):
            self.write_stream.wait_stream(self.api.current_stream(self.dev.device))
            idx = to_device(dev_slots, self.dev.device) if parts else None
            self._copy_out(direct, idx, parts, staging)
            event = self._mark()
        return self._pending(_Backup(event, staging, host_slots, done, tick=self.ticks), start)

    def _pending(self, backup: _Backup, start: float) -> _Backup:
        self.backup_issue_seconds += time.perf_counter() - start
        self.pending.append(backup)
        return backup

    def _mark(self) -> Any:
        """An event recorded on the current stream (a side stream's, inside ``api.stream``)."""
        event = self.api.Event()
        event.record()
        return event

    def _slot_pairs(self, dev_slots: torch.Tensor, host_slots: torch.Tensor) -> torch.Tensor:
        """``[2, n]``: device slots, host slots, on the device (one pinned upload)."""
        return to_device(torch.stack([dev_slots, host_slots]), self.dev.device)

    def _copy_out(self, direct: list, idx: torch.Tensor | None, parts: list,
                  staging: torch.Tensor | None) -> None:
        """``direct``: (device first, host first, length) stretches; ``idx``/``parts``: the
        other tokens' device slots and host runs (None/empty: no other tokens)."""
        async_ = self.cuda
        for layer in range(self.dev.num_layers):
            for which, (dev, host) in enumerate(self._pairs(layer)):
                for d, h, m in direct:
                    host[h:h + m].copy_(dev[d:d + m], non_blocking=async_)
                if idx is None:
                    continue
                rows = dev.index_select(0, idx)
                if staging is not None:
                    staging[layer, which].copy_(rows, non_blocking=async_)
                    continue
                for off, first, n in parts:
                    host[first:first + n].copy_(rows[off:off + n], non_blocking=async_)

    def fence(self, event: Any) -> None:
        """Before device slots a copy may still touch are freed for reuse (the gather of a
        backup, ``event`` its last; a load, ``event`` its last): the compute stream waits for
        that copy, unless it has landed (a device-side wait; the host does not block)."""
        if event is not None and not event.query():
            self.api.current_stream(self.dev.device).wait_event(event)

    def tick(self) -> None:
        """One scheduler step went by (lockstep: backups age by steps, not by their events)."""
        self.ticks += 1

    def poll(self) -> None:
        """Finish the backups whose copies have landed (no waiting); time finished loads.
        Lockstep: those issued ``LOCKSTEP_LAG`` steps ago or more, waiting if need be."""
        if self.lockstep:
            while self.pending and self.ticks - self.pending[0].tick >= LOCKSTEP_LAG:
                backup = self.pending.pop(0)
                backup.event.synchronize()
                self._finish_one(backup)
        while not self.lockstep and self.pending and self.pending[0].event.query():
            self._finish_one(self.pending.pop(0))
        while self._timed and self._timed[0][1].query():
            begin, end = self._timed.pop(0)
            self.load_seconds += begin.elapsed_time(end) / 1e3

    def finish(self) -> None:
        """Finish every pending backup and timed load (waits for the side stream)."""
        while self.pending:
            backup = self.pending.pop(0)
            backup.event.synchronize()
            self._finish_one(backup)
        for begin, end in self._timed:
            end.synchronize()
            self.load_seconds += begin.elapsed_time(end) / 1e3
        self._timed.clear()

    def _finish_one(self, backup: _Backup) -> None:
        if backup.staging is not None:
            self.host.scatter(backup.host_slots, backup.staging)
        backup.landed = True
        backup.done()

    # -- host -> device ---------------------------------------------------------------------
    def load(self, host_slots: torch.Tensor, dev_slots: torch.Tensor, after: list) -> Any:
        """Copy host rows into device rows, layer by layer, ahead of the attention that reads
        them; ``after``: events of backups still filling these host rows. Returns the load's
        last event (CUDA; None on the CPU, where it is done)."""
        start = time.perf_counter()
        self.bytes_h2d += int(host_slots.numel()) * self.host.bytes_per_token
        self.loads += 1
        if self.io is not None:
            return self._queue_load(start, after, lambda: self.io.load(
                self._slot_pairs(dev_slots, host_slots), self._mark))
        direct, dev_slots, host_slots = self._plan(dev_slots, host_slots)  # the rest: gathered
        parts = runs(host_slots)
        if not self.cuda:
            self._copy_in(direct, dev_slots if parts else None, parts, None)
            self.load_seconds += time.perf_counter() - start
            self.load_issue_seconds += time.perf_counter() - start
            return None
        staging = None
        if len(parts) > MAX_RUNS:
            for event in after:  # NOTE: the gather reads the host rows on the CPU: they must
                event.synchronize()  # have landed (the host waits, on this rare path only)
            staging = self.host.gather(host_slots, out=torch.empty(
                (self.dev.num_layers, 2, int(host_slots.numel()), *self.host.row_shape),
                dtype=self.host.raw_dtype, pin_memory=True))
        return self._queue_load(start, after, lambda: self._copy_in(
            direct, to_device(dev_slots, self.dev.device) if parts else None, parts, staging))

    def _queue_load(self, start: float, after: list, copies: Callable[[], list]) -> Any:
        """Queue ``copies()`` (which returns its per-layer events) on the next load stream,
        after the compute stream and the backups ``after``; timed by events around it."""
        main = self.api.current_stream(self.dev.device)
        stream = self.load_streams[self._turn]
        self._turn = (self._turn + 1) % len(self.load_streams)
        with self.api.stream(stream):
            stream.wait_stream(main)
            for event in after:
                stream.wait_event(event)
            begin = self.api.Event(enable_timing=True)
            begin.record(stream)
            layers = copies()
            end = self.api.Event(enable_timing=True)
            end.record(stream)
        self.dev.await_layers(layers)
        self.load_issue_seconds += time.perf_counter() - start
        # NOTE: latency = the copy's time on the load stream, read from the events once they
        # have fired (``poll``); the host only queued it.
        self._timed.append((begin, end))
        return end

    def _copy_in(self, direct: list, idx: torch.Tensor | None, parts: list,
                 staging: torch.Tensor | None) -> list:
        """The copies of every layer (``direct``: (device first, host first, length)
        stretches; ``idx``/``parts``: the other tokens' device slots and host runs); on CUDA
        an event after each layer's (returned)."""
        async_, events = self.cuda, []
        for layer in range(self.dev.num_layers):
            for which, (dev, host) in enumerate(self._pairs(layer)):
                for d, h, m in direct:
                    dev[d:d + m].copy_(host[h:h + m], non_blocking=async_)
                if idx is None:
                    continue
                if staging is not None:
                    rows = staging[layer, which].to(dev.device, non_blocking=async_)
                else:
                    rows = torch.empty((int(idx.numel()), *dev.shape[1:]), dtype=dev.dtype,
                                       device=dev.device)
                    for off, first, m in parts:
                        rows[off:off + m].copy_(host[first:first + m], non_blocking=async_)
                dev.index_copy_(0, idx, rows)
            if async_:
                events.append(self._mark())  # on the load's stream (the current one here)
        return events

    def stats(self) -> dict[str, float | int]:
        return {"hicache_bytes_device_to_host": self.bytes_d2h,
                "hicache_bytes_host_to_device": self.bytes_h2d,
                "hicache_loads_total": self.loads,
                "hicache_backups_total": self.backups,
                # loads + backups with a part copied pool to pool (``split``)
                "hicache_direct_moves_total": self.direct_moves,
                "hicache_load_seconds_total": self.load_seconds,
                "hicache_load_latency_avg_s": self.load_seconds / self.loads if self.loads else 0.0,
                "hicache_load_issue_seconds_total": self.load_issue_seconds,
                "hicache_backup_issue_seconds_total": self.backup_issue_seconds,
                "hicache_pending_backups": len(self.pending),
                # 1: moves go through the KV move kernel (kernel_io.py), 0: plain copies
                "hicache_io_kernel": int(self.io is not None)}

"""The machinery between a prefill and a decode scheduler process, all of it torch.distributed:

- the control store: a ``TCPStore`` served by the prefill process on
  ``--disaggregation-bootstrap-port``. Decode processes announce themselves and register the
  requests they hold slots for (``reg/<n>``, one sequence for all of them); the prefill process
  tells each decode process, in the order it will send them, which request's pages come next
  (``p2d/<decode id>/<k>``). Messages are small JSON values.
- a tensor-parallel decode server is one peer per rank, each holding a share of the kv heads
  (``heads`` in its announcement): the prefill side sends each rank its heads' pages, and
  starts a request once every rank registered it (``shards`` in a registration). A
  tensor-parallel prefill server (``prefill/info``: its tp size) serves the store on rank 0;
  each decode rank gets each of its heads from the prefill rank holding it (``shards.py``).
- one two-rank process group per (prefill rank, decode rank) pair that carries pages, made
  over the store (group rank 0: prefill):
  gloo for CPU tensors, NCCL for CUDA ones. The KV pages travel as point-to-point send/recv,
  two messages per layer (K, then V: ``[tokens, kv_heads, head_dim]``), a few layers in
  flight; the decode side receives a run of consecutive slots in place.

Both sides post their operations in the same order (the ``p2d`` sequence), so the transfer needs
no tags and runs unchanged on NCCL, which matches point-to-point operations by order alone.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import socket
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

# NOTE: layers in flight per transfer: enough to keep the link busy while the next layer is
# gathered, few enough that a transfer stages only a few layers' pages at a time.
LAYER_WINDOW = 4
# NOTE: a blocking store wait; long, because c10d logs a warning each time one times out (the
# waiting threads are daemons, and a dead store ends a wait at once with an error).
STORE_WAIT_S = 600.0


@dataclass(frozen=True)
class KVLayout:
    """What both sides' KV pools must agree on for pages to be copied as bytes."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: str

    @classmethod
    def of(cls, pool: Any) -> "KVLayout":
        _, heads, dim = pool.k_buffer[0].shape
        return cls(pool.num_layers, int(heads), int(dim), str(pool.dtype))

    def to_json(self) -> dict:
        return asdict(self)


def serve_store(port: int, timeout_s: float) -> dist.TCPStore:
    """The prefill side's control store (listens on every interface)."""
    return dist.TCPStore("0.0.0.0", port, None, True, _td(timeout_s), wait_for_workers=False)


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A client of a prefill server's store. One per thread: a blocking wait holds it."""
    return dist.TCPStore(host, port, None, False, _td(timeout_s))


def put(store: dist.TCPStore, key: str, value: dict) -> None:
    store.set(key, json.dumps(value))


def take(store: dist.TCPStore, key: str, stop: Any) -> dict | None:
    """Wait for ``key``, read and delete it; None once ``stop()`` says so. A store error
    (the other process died) propagates."""
    while not stop():
        try:
            store.wait([key], _td(STORE_WAIT_S))
        except RuntimeError as exc:  # NOTE: DistStoreError subclasses RuntimeError
            if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
                continue
            raise
        value = json.loads(store.get(key))
        store.delete_key(key)
        return value
    return None


def local_address(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (what the peer can reach us at)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), port))
        return s.getsockname()[0]


def make_group(store: dist.TCPStore, pair_id: str, rank: int, backend: str, host: str,
               timeout_s: float) -> Any:
    """The pair's two-rank process group (blocks until the other side makes it too).
    ``host``: this side's address for gloo's connections."""
    prefixed = dist.PrefixStore(f"pg/{pair_id}/", store)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        opts._timeout = _td(timeout_s)
        return dist.ProcessGroupGloo(prefixed, rank, 2, opts)
    opts = dist.ProcessGroupNCCL.Options()
    with contextlib.suppress(AttributeError):  # NOTE: not settable on every torch version
        opts._timeout = _td(timeout_s)
    return dist.ProcessGroupNCCL(prefixed, rank, 2, opts)


def send_pages(group: Any, pool: Any, slots: torch.Tensor, peer: int, host_staged: bool,
               heads: tuple[int, int] | None = None) -> None:
    """Every layer's pages at ``slots`` to ``peer``: per layer its K then its V rows
    (``[n, kv_heads, head_dim]`` as stored), a window in flight. ``host_staged``: the group
    carries CPU tensors (gloo) while the pool may be on a GPU. ``heads``: only kv heads
    ``[start, end)`` (a tensor-parallel decode rank's share)."""
    slots = slots.to(pool.device)
    inflight: deque = deque()
    for layer in range(pool.num_layers):
        for buf in pool.page_buffers(layer):
            pages = buf.index_select(0, slots)
            if heads is not None:
                pages = pages[:, heads[0]:heads[1]].contiguous()
            if host_staged and pages.device.type != "cpu":
                pages = pages.cpu()
            inflight.append((group.send([pages], peer, 0), pages))
            if len(inflight) > 2 * LAYER_WINDOW:
                inflight.popleft()[0].wait()
    while inflight:
        inflight.popleft()[0].wait()
    _sync(pool.device)


def recv_pages(sources: list[tuple[Any, tuple[int, int]]], pool: Any,
               slots: torch.Tensor | None, count: int, host_staged: bool) -> bool:
    """``count`` tokens' pages of every layer into ``slots`` (None: received and dropped, to
    keep each pair's order when the request went away meanwhile). ``sources``: ``(group,
    (first, end))``, the pair group of each prefill rank sending this pool's kv heads
    ``[first, end)`` (local indices; one source with every head unless the prefill server is
    tensor-parallel with other head splits), posted layer by layer in this order.

    One source with every head into slots that are one ascending run (a fresh allocation usually
    is) is received in place: straight into the pool's rows, no staging buffer and no scatter
    copy (True returned); other pages are staged and copied into their heads' columns."""
    layout = KVLayout.of(pool)
    raw = torch.uint8 if pool.dtype == torch.float8_e4m3fn else pool.dtype
    whole = len(sources) == 1 and tuple(sources[0][1]) == (0, layout.kv_heads)
    run = (_run(slots) if whole and (pool.device.type == "cpu" or not host_staged) else None)
    dev_slots = slots.to(pool.device) if slots is not None and run is None else None
    where = "cpu" if host_staged else pool.device
    inflight: deque = deque()

    def land() -> None:
        buf, (lo, hi), work, pages = inflight.popleft()
        work.wait()
        if dev_slots is not None:
            buf[:, lo:hi].index_copy_(0, dev_slots, pages.to(pool.device, non_blocking=False))

    for layer in range(pool.num_layers):
        for buf in pool.page_buffers(layer):
            for group, (lo, hi) in sources:
                pages = (buf[run[0]:run[1]] if run is not None else
                         torch.empty((count, hi - lo, layout.head_dim), dtype=raw, device=where))
                inflight.append((buf, (lo, hi), group.recv([pages], 0, 0), pages))
                if len(inflight) > 2 * LAYER_WINDOW * len(sources):
                    land()
    while inflight:
        land()
    _sync(pool.device)
    return run is not None  # received in place


def _run(slots: torch.Tensor | None) -> tuple[int, int] | None:
    """``(first, last + 1)`` when ``slots`` are consecutive ascending ids, else None."""
    if slots is None or slots.numel() == 0:
        return None
    first, n = int(slots[0]), int(slots.numel())
    if int(slots[-1]) != first + n - 1 or (n > 1 and not bool((slots.diff() == 1).all())):
        return None
    return first, first + n


def device_stream(device: torch.device) -> Any:
    """A transfer thread's own CUDA stream, so its copies and NCCL work overlap the scheduler's
    forwards instead of queueing behind them (a null context on the CPU). The pages a thread
    reads were written by a forward the scheduler has already synchronized with (it read that
    step's tokens); the pages it writes are synchronized (``_sync``) before it reports them."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    set_cuda_device(device)
    return torch.cuda.stream(torch.cuda.Stream(device))


def set_cuda_device(device: torch.device) -> None:
    """This thread's current device (a new thread starts on device 0 of the visible ones)."""
    torch.cuda.set_device(device.index if device.index is not None else 0)


def _sync(device: torch.device) -> None:
    """On CUDA the copies and the NCCL work are queued: done before the pages are used."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)

"""ReceiverLink: one prefill server as a decode server sees it.

Two threads: the link thread connects to the prefill server's control store, reads the prefill
server's tp size, announces this process (its id, the prefill's address as seen from here, its
KV layout and heads), joins the process group of each prefill rank sending it heads and then
writes this side's registrations; the receive thread reads the prefill side's notices in order
(``p2d/<id>/<k>``) and receives each one's pages (from every source rank) into the slots the
request holds (or drops them when the request went away meanwhile: the pair's order must hold).
Everything that ends goes to the decode side through its ``done`` queue; a broken link sets
``error`` and stops.
"""
from __future__ import annotations

import json
import queue
import socket
import threading
from dataclasses import dataclass
from typing import Any

import torch

from .link import (KVLayout, connect_store, device_stream, local_address, make_group, put,
                   recv_pages, set_cuda_device, take)
from .shards import sources

REGISTRATION_WAIT_S = 0.5


@dataclass
class Entry:
    """A registered request's slots, shared with the receive thread (under the link's lock)."""

    slots: torch.Tensor
    started: bool = False  # its pages are being received: the slots stay until that ends
    cancelled: bool = False


class ReceiverLink:
    def __init__(self, host: str, port: int, my_id: str, backend: str, timeout_s: float,
                 pool: Any, done: queue.Queue, heads: tuple[int, int], kv_heads: int,
                 shards: int = 1) -> None:
        """``heads``: the model's kv heads ``[start, end)`` this pool holds of ``kv_heads``
        (tensor parallelism: of ``shards`` ranks that each register every request)."""
        self.host, self.port, self.my_id = host, port, my_id
        self.heads, self.kv_heads, self.shards = tuple(heads), kv_heads, shards
        self.error: str | None = None
        self.entries: dict[str, Entry] = {}
        self.lock = threading.Lock()
        self._backend, self._timeout, self._pool, self._done = backend, timeout_s, pool, done
        self._outbox: queue.Queue = queue.Queue()
        self._sources: list = []  # (group, local heads) per prefill rank sending to us
        self._ready = threading.Event()
        self._stop = False
        self.receiver_exited = False  # no page will be written any more: every slot is free
        self.in_place_tokens = 0  # tokens whose pages landed straight in their slots
        for target, name in ((self._link, "pd-link"), (self._receive, "pd-recv")):
            threading.Thread(target=target, name=f"{name}-{port}", daemon=True).start()

    # -- the decode side's calls (scheduler thread) -------------------------------------------
    def register(self, key: str, slots: torch.Tensor, start: int) -> None:
        with self.lock:
            self.entries[key] = Entry(slots)
        self._outbox.put({"type": "room", "key": key, "peer": self.my_id, "start": start,
                          "shards": self.shards})

    def cancel(self, key: str) -> bool:
        """Forget ``key``; False while its pages are being received (free its slots later)."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None and entry.started and not self.receiver_exited:
                entry.cancelled = True
                return False
            self.entries.pop(key, None)
            return True

    def close(self) -> None:
        self._stop = True

    # -- threads -----------------------------------------------------------------------------
    def _fail(self, what: str, exc: BaseException) -> None:
        if self.error is None:
            self.error = (f"prefill server {self.host}:{self.port}: {what}: "
                          f"{type(exc).__name__}: {exc}")
        self._ready.set()

    def _link(self) -> None:
        try:
            store = connect_store(self.host, self.port, self._timeout)
            me = local_address(self.host, self.port)
            plan = self._plan(json.loads(store.get("prefill/info")))
            n = store.add("reg_n", 1)
            put(store, f"reg/{n}", {"type": "peer", "peer": self.my_id,
                                    "host": socket.gethostbyname(self.host),
                                    "layout": KVLayout.of(self._pool).to_json(),
                                    "heads": list(self.heads)})
            if self._pool.device.type == "cuda":
                set_cuda_device(self._pool.device)
            first = self.heads[0]
            # NOTE: in the plan's order, as the prefill ranks' sender threads make them
            self._sources = [(make_group(store, f"{self.my_id}/{rank}", 1, self._backend, me,
                                         self._timeout), (lo - first, hi - first))
                             for rank, lo, hi in plan]
        except Exception as exc:  # noqa: BLE001 - every request on this link fails with it
            self._fail("cannot connect", exc)
            return
        self._ready.set()
        try:
            while not self._stop:
                try:
                    msg = self._outbox.get(timeout=REGISTRATION_WAIT_S)
                except queue.Empty:
                    continue
                put(store, f"reg/{store.add('reg_n', 1)}", msg)
        except Exception as exc:  # noqa: BLE001
            self._fail("lost", exc)

    def _plan(self, info: dict) -> list[tuple[int, int, int]]:
        """Which prefill rank sends which of our heads (``prefill/info``: its tp size)."""
        if int(info["kv_heads"]) != self.kv_heads:
            raise ValueError(f"the prefill server's model has {info['kv_heads']} kv heads, "
                             f"this one {self.kv_heads}")
        return sources(self.heads, int(info["tp_size"]), self.kv_heads)

    def _receive(self) -> None:
        self._ready.wait()
        if self.error is not None:
            self.receiver_exited = True
            return
        try:
            store = connect_store(self.host, self.port, self._timeout)
            with device_stream(self._pool.device):
                seq = 0
                while (notice := take(store, f"p2d/{self.my_id}/{seq}",
                                      self._stopped)) is not None:
                    seq += 1
                    self._one(notice)
        except Exception as exc:  # noqa: BLE001
            self._fail("lost", exc)
        finally:
            self.receiver_exited = True

    def _stopped(self) -> bool:
        return self._stop or self.error is not None

    def _one(self, notice: dict) -> None:
        key = str(notice["key"])
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None:
                entry.started = True
        if notice.get("pages"):
            count = int(notice["count"])
            fits = entry is not None and int(entry.slots.numel()) == count
            if entry is not None and not fits:
                notice = {**notice, "error": f"page count {count} != the "
                                             f"{int(entry.slots.numel())} slots registered"}
            if recv_pages(self._sources, self._pool, entry.slots if fits else None, count,
                          host_staged=self._backend == "gloo"):
                self.in_place_tokens += count
        with self.lock:
            self.entries.pop(key, None)
        self._done.put((key, notice))

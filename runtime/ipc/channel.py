"""ZMQ PUSH/PULL channels over ipc:// sockets in a private temp directory.

The main process binds both ends (it outlives the child); the scheduler process connects. One
direction per socket keeps ordering simple: messages on a channel arrive in the order sent. A
list sent as one message (a batch call's requests) reaches the scheduler as its items, in order,
all in the same drain.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import zmq

from .messages import dumps, loads


@dataclass(frozen=True)
class IpcPaths:
    """Endpoints of the two channels: requests to the scheduler, outputs from it."""

    to_scheduler: str
    from_scheduler: str
    folder: str

    @classmethod
    def create(cls) -> "IpcPaths":
        folder = tempfile.mkdtemp(prefix="sgdsl-ipc-")
        return cls(to_scheduler=f"ipc://{os.path.join(folder, 'req')}",
                   from_scheduler=f"ipc://{os.path.join(folder, 'out')}", folder=folder)

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class SyncChannel:
    """The scheduler process's side: blocking sockets, with a non-blocking drain.
    ``receive=False``: send only (a tensor-parallel follower rank reports its errors here but
    must not take requests: PUSH would deal them out round-robin over connected peers)."""

    def __init__(self, paths: IpcPaths, receive: bool = True) -> None:
        self.ctx = zmq.Context(1)
        self.recv_sock = self.ctx.socket(zmq.PULL)
        if receive:
            self.recv_sock.connect(paths.to_scheduler)
        self.send_sock = self.ctx.socket(zmq.PUSH)
        # NOTE: linger bounds how long close() waits for undelivered output at exit.
        self.send_sock.setsockopt(zmq.LINGER, 2000)
        self.send_sock.connect(paths.from_scheduler)

    def send(self, msg: Any) -> None:
        self.send_sock.send(dumps(msg), copy=False)

    def recv_all(self) -> list[Any]:
        """Everything queued right now, without blocking."""
        out: list[Any] = []
        while True:
            try:
                msg = loads(self.recv_sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                return out
            out.extend(msg) if isinstance(msg, list) else out.append(msg)

    def wait(self, timeout_ms: int) -> bool:
        """Block until a message is queued or the timeout passes."""
        return bool(self.recv_sock.poll(timeout_ms, zmq.POLLIN))

    def close(self) -> None:
        self.recv_sock.close(linger=0)
        self.send_sock.close()
        self.ctx.term()


class AsyncChannel:
    """The main process's side (asyncio): binds both sockets before the child starts."""

    def __init__(self, paths: IpcPaths) -> None:
        import zmq.asyncio

        self.ctx = zmq.asyncio.Context(1)
        self.send_sock = self.ctx.socket(zmq.PUSH)
        self.send_sock.setsockopt(zmq.LINGER, 0)
        self.send_sock.bind(paths.to_scheduler)
        self.recv_sock = self.ctx.socket(zmq.PULL)
        self.recv_sock.setsockopt(zmq.LINGER, 0)
        self.recv_sock.bind(paths.from_scheduler)

    def send_nowait(self, msg: Any) -> None:
        # NOTE: PUSH with a connected peer queues without blocking (high-water mark permitting).
        self.send_sock.send(dumps(msg), flags=zmq.NOBLOCK, copy=False)

    async def recv(self, timeout_s: float | None = None) -> Any | None:
        """Next message, or None after ``timeout_s`` seconds."""
        if timeout_s is not None:
            if not await self.recv_sock.poll(int(timeout_s * 1000), zmq.POLLIN):
                return None
        return loads(await self.recv_sock.recv(copy=True))

    def close(self) -> None:
        self.send_sock.close(linger=0)
        self.recv_sock.close(linger=0)
        self.ctx.term()

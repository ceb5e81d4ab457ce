"""``Mailbox``: items handed from the engine's loop to one caller's asyncio loop (another
thread), with one wake-up of that loop per engine-loop pass instead of one per item.

A server streams every request of a batch on its own loop; each engine step produces a chunk
for each of them, and ``loop.call_soon_threadsafe`` per chunk wrote to the caller loop's
self-pipe once per chunk: at batch 128 that was the largest single cost of the engine thread
while streaming (a system call and a thread switch per request per step). Chunks put during one
pass of the engine loop (one scheduler output wakes every stream in the same pass) now go in one
wake-up, sent at the end of that pass.
"""
from __future__ import annotations

import asyncio
import collections
import weakref
from typing import Any


class Mailbox:
    """``put(queue, item)`` on the engine loop; the caller loop's next turn puts every waiting
    item into its queue, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 source: asyncio.AbstractEventLoop) -> None:
        self.loop = loop  # the caller's: where the items go
        self.source = source  # the engine's: where put runs
        self._items: collections.deque[tuple[asyncio.Queue, Any]] = collections.deque()
        self._send_pending = False

    def put(self, queue: asyncio.Queue, item: Any) -> None:
        self._items.append((queue, item))
        if not self._send_pending:  # sent after the other streams of this pass put theirs
            self._send_pending = True
            self.source.call_soon(self._send)

    def _send(self) -> None:
        # NOTE: deque appends (engine thread) and pops (caller thread) are thread-safe; an
        # item appended after this wake-up was sent schedules its own send, so none is left
        # behind (a wake-up may then find the box already emptied: harmless).
        self._send_pending = False
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the caller's loop is closed: nobody is left to read them
            self._items.clear()

    def _drain(self) -> None:
        while self._items:
            queue, item = self._items.popleft()
            queue.put_nowait(item)


class Mailboxes:
    """One ``Mailbox`` per caller loop, dropped with that loop."""

    def __init__(self, source: asyncio.AbstractEventLoop) -> None:
        self.source = source
        self._by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def of(self, loop: asyncio.AbstractEventLoop) -> Mailbox:
        box = self._by_loop.get(loop)
        if box is None:
            box = self._by_loop.setdefault(loop, Mailbox(loop, self.source))
        return box

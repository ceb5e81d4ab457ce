"""``EncodeBatcher``: long chat prompts that need encoding in the same loop turn go to one
worker-thread call of the tokenizer's batch encode, and come back together.

A long prompt is encoded off the event loop (``OFFLOAD_ENCODE_CHARS``). One thread-pool job per
request let a burst's encodes finish one by one, so their Engine calls left in as many loop
turns and the Engine's submitter (runtime/submitter.py) saw a trickle again. One batch encode per
loop turn (the Rust backend tokenizes the texts in parallel, without the GIL) returns every
prompt of that turn at once, and their Engine calls travel together. A lone prompt still costs
one thread hop, as before. While a turn's prompts are being encoded, ``hold`` (the Engine's
``hold_handoff``) keeps the Engine's next hand-off for them: the requests of the same burst
that needed no encoding off the loop (short prompts, earlier turns) wait the encode's
milliseconds instead of going ahead alone.
"""
from __future__ import annotations

import asyncio
import functools
from typing import Callable

EncodeMany = Callable[[list[str]], list[list[int]]]
Hold = Callable[[], Callable[[], None]]  # hold() -> release()


class EncodeBatcher:
    """``await encode(text)`` on any loop; the texts of one loop turn are encoded together."""

    def __init__(self, encode_many: EncodeMany, hold: Hold | None = None) -> None:
        self.encode_many = encode_many
        self.hold = hold
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[str, asyncio.Future]]] = {}
        self._releases: dict[asyncio.AbstractEventLoop, Callable[[], None]] = {}

    async def encode(self, text: str) -> list[int]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        items = self._pending.setdefault(loop, [])
        items.append((text, future))
        if len(items) == 1:
            if self.hold is not None:  # from this turn on: see the module docstring
                self._releases[loop] = self.hold()
            loop.call_soon(self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        live = [(t, f) for t, f in self._pending.pop(loop, []) if not f.done()]
        release = self._releases.pop(loop, None)
        if not live:
            if release is not None:
                release()
            return
        job = loop.run_in_executor(None, self.encode_many, [t for t, _ in live])
        job.add_done_callback(functools.partial(_deliver, [f for _, f in live], release))


def _deliver(futures: list[asyncio.Future], release: Callable[[], None] | None,
             job: asyncio.Future) -> None:
    try:
        error = job.exception() if not job.cancelled() else asyncio.CancelledError()
        for i, future in enumerate(futures):
            if future.done():  # its request went away meanwhile
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(job.result()[i])
    finally:
        # NOTE: after the results are set: their handlers resume (and submit) at the next
        # turn, ahead of the hand-off check this schedules
        if release is not None:
            release()

"""``EncodeBatcher``: long chat prompts that need encoding in the same loop turn go to one
worker-thread call of the tokenizer's batch encode, and come back together.

A long prompt is encoded off the event loop (``OFFLOAD_ENCODE_CHARS``). One thread-pool job per
request let a burst's encodes finish one by one, so their Engine calls left in as many loop
turns and the Engine's submitter (runtime/submitter.py) saw a trickle again. One batch encode per
loop turn (the Rust backend tokenizes the texts in parallel, without the GIL) returns every
prompt of that turn at once, and their Engine calls travel together. A lone prompt still costs
one thread hop, as before.
"""
from __future__ import annotations

import asyncio
import functools
from typing import Callable

EncodeMany = Callable[[list[str]], list[list[int]]]


class EncodeBatcher:
    """``await encode(text)`` on any loop; the texts of one loop turn are encoded together."""

    def __init__(self, encode_many: EncodeMany) -> None:
        self.encode_many = encode_many
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[str, asyncio.Future]]] = {}

    async def encode(self, text: str) -> list[int]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        items = self._pending.setdefault(loop, [])
        items.append((text, future))
        if len(items) == 1:
            loop.call_soon(self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        live = [(t, f) for t, f in self._pending.pop(loop, []) if not f.done()]
        if live:
            job = loop.run_in_executor(None, self.encode_many, [t for t, _ in live])
            job.add_done_callback(functools.partial(_deliver, [f for _, f in live]))


def _deliver(futures: list[asyncio.Future], job: asyncio.Future) -> None:
    error = job.exception() if not job.cancelled() else asyncio.CancelledError()
    for i, future in enumerate(futures):
        if future.done():  # its request went away meanwhile
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(job.result()[i])

"""``Coalescer``: generate requests issued in the same moment go to the engine as one call.

``run_batch`` starts many programs at once; each ``gen`` would otherwise reach the Engine as
its own call, trickling into the scheduler one by one (more, smaller batches). Requests that
arrive within a few event-loop turns are sent together as one list request, exactly what a
caller of ``Engine.generate([...])`` would send. Each caller still gets its own result or
error, and keeps its own request id (so cancelling one aborts only that one).

The flush runs at the loop's next iteration: every task already scheduled when the first
request arrives (the programs started by the same wakeup) reaches its request first. Waiting
longer costs more than it gathers: while body threads hold the GIL, each extra loop iteration
can wait a whole GIL switch interval (5 ms). The exception is a burst announced on the loop's
``BurstGate`` (``run_batch`` starting its programs): the flush then waits for the gate, so the
burst goes out as one call (``burst.py`` says why)."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from .burst import BurstGate, burst_gate

_OPTION_KEYS = ("return_logprob", "logprob_start_len", "top_logprobs_num",
                "return_text_in_logprobs")

Call = Callable[[dict[str, Any]], Awaitable[Any]]
# a group of requests as separate calls started together (None: send it as one list call)
Each = Callable[[list[dict[str, Any]]], "list[Awaitable[Any]] | None"]


def batchable(request: dict[str, Any]) -> bool:
    """Single text prompts with one completion (lists, ids, n>1, streams go straight through)."""
    return (isinstance(request.get("text"), str) and not request.get("stream")
            and not request.get("image_data")  # a batch call takes images per prompt
            and (request.get("sampling_params") or {}).get("n", 1) == 1)


class Coalescer:
    """Per event loop: collects batchable requests and flushes them through ``call``."""

    def __init__(self, call: Call,
                 failed: Callable[[Any], BaseException | None] = lambda out: None,
                 each: Each | None = None) -> None:
        """``failed(out)``: the error to raise to the caller whose batched request came back
        failed in its own output (a list call reports such a request in its dict), else None.
        ``each(requests)``: the group's requests as separate calls, already started together
        (each caller then gets its result as soon as its own request finishes), or None for
        one list call."""
        self._call = call
        self._failed = failed
        self._each = each
        self._pending: list[tuple[dict[str, Any], asyncio.Future]] = []
        self._flushing = False
        self._sending: set[asyncio.Task] = set()  # strong references while in flight
        self._gate: BurstGate | None = None  # this loop's (made at the first request)

    async def submit(self, request: dict[str, Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._gate is None:
            self._gate = burst_gate(loop)
        self._gate.last_arrival = time.monotonic()  # a burst holding the gate goes on
        self._pending.append((request, future))
        if not self._flushing:
            self._flushing = True
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        if self._gate is not None and self._gate.defer(self._flush):
            return  # a burst is still arriving: all of it goes at once when the gate opens
        pending, self._pending, self._flushing = self._pending, [], False
        groups: dict[tuple, list[tuple[dict[str, Any], asyncio.Future]]] = {}
        for item in pending:
            if not item[1].done():  # cancelled while waiting: never sent
                groups.setdefault(tuple(item[0].get(k) for k in _OPTION_KEYS), []).append(item)
        loop = asyncio.get_running_loop()
        for items in groups.values():
            task = loop.create_task(self._send(items))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, items: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        if len(items) == 1:
            return await _settle(items[0][1], self._call(items[0][0]))
        calls = self._each([r for r, _ in items]) if self._each is not None else None
        if calls is not None:
            await asyncio.gather(*(_settle(f, c) for (_, f), c in zip(items, calls)))
            return
        first = items[0][0]
        request = {k: first[k] for k in _OPTION_KEYS if k in first}
        request.update(text=[r["text"] for r, _ in items], rid=[r["rid"] for r, _ in items],
                       sampling_params=[r.get("sampling_params") or {} for r, _ in items])
        try:
            outs = await self._call(request)
        except Exception:  # noqa: BLE001 - one bad request fails a batch: retry one by one
            await asyncio.gather(*(_settle(f, self._call(r)) for r, f in items))
            return
        for (_, future), out in zip(items, outs):
            if not future.done():  # a request that failed in a batch: its own error
                err = self._failed(out)
                future.set_exception(err) if err is not None else future.set_result(out)


async def _settle(future: asyncio.Future, result: Awaitable[Any]) -> None:
    try:
        value = await result
    except Exception as exc:  # noqa: BLE001 - delivered to the waiting caller
        if not future.done():
            future.set_exception(exc)
        return
    if not future.done():
        future.set_result(value)

"""Mailbox: chunks put on the engine's loop reach each stream's queue on the caller's loop, in
order, with one wake-up of the caller's loop per engine-loop pass (not one per chunk)."""
from __future__ import annotations

import asyncio
import threading

from sgdsl.runtime.mailbox import Mailboxes


def test_one_wake_up_per_pass_and_every_item_in_order():
    source = asyncio.new_event_loop()
    thread = threading.Thread(target=source.run_forever, daemon=True)
    thread.start()
    boxes = Mailboxes(source)

    async def main():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe

        def counting(*args, **kw):
            wakeups.append(args[0])
            return real(*args, **kw)
        loop.call_soon_threadsafe = counting  # instance attribute: this loop only
        box = boxes.of(loop)
        assert boxes.of(loop) is box
        queues = [asyncio.Queue() for _ in range(16)]

        def one_pass(step: int) -> None:  # as one scheduler output wakes every stream
            for i, q in enumerate(queues):
                box.put(q, (i, step))
        for step in range(5):
            source.call_soon_threadsafe(one_pass, step)
            got = [await asyncio.wait_for(q.get(), 30) for q in queues]
            assert got == [(i, step) for i in range(16)]
        assert len(wakeups) == 5  # not 80
        del loop.call_soon_threadsafe
    try:
        asyncio.run(main())
    finally:
        source.call_soon_threadsafe(source.stop)
        thread.join(5)


def test_a_closed_caller_loop_drops_its_items():
    source = asyncio.new_event_loop()
    caller = asyncio.new_event_loop()
    caller.close()
    box = Mailboxes(source).of(caller)
    box.put(asyncio.Queue(), "x")
    source.call_soon(source.stop)
    source.run_forever()  # runs the send: the closed loop refuses it, the item is dropped
    assert not box._items
    source.close()


def test_many_concurrent_streams_match_their_plain_outputs(engine):
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    prompts = [f"Item {i}:" for i in range(24)]
    plain = engine.generate(prompts, params)

    async def one(prompt: str) -> tuple[str, str]:
        deltas, last = [], None
        async for last in await engine.async_generate(prompt, params, stream=True):
            deltas.append(last["delta"])
        return "".join(deltas), last["text"]
    streamed = asyncio.run(_gather(one, prompts))
    for out, (joined, final) in zip(plain, streamed):
        assert joined == final == out["text"]


async def _gather(fn, items):
    return await asyncio.gather(*(fn(x) for x in items))

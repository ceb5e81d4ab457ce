"""Single ``async_generate`` calls of one loop turn travel to the scheduler together
(runtime/submitter.py), yet each caller keeps its own result, error, cancellation and timing.

Tiny random model (``engine``: the session's tiny Engine, idle invariant checked after each
test); outputs are told apart by their lengths (ignore_eos, a different budget each)."""
from __future__ import annotations

import asyncio

import pytest

from sgdsl.runtime.errors import ContextLengthError, InvalidRequestError

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
LONG = 400  # ignore_eos tokens: hundreds of steps, while a cancel or a short request takes one


def _params(n: int, **extra) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True, **extra}


async def _counts(engine) -> tuple[int, int]:
    """(hand-offs, requests) so far, summed over the engine's live submitters (one per loop)."""
    stats = await asyncio.to_thread(engine.stats)
    return stats["submit_handoffs"], stats["submit_requests"]


async def _counted(engine, calls) -> tuple[list, tuple[int, int]]:
    """The calls' outcomes (exceptions included) and the hand-offs and requests they took."""
    h0, r0 = await _counts(engine)
    outs = await asyncio.gather(*calls, return_exceptions=True)
    h1, r1 = await _counts(engine)
    return outs, (h1 - h0, r1 - r0)


def test_a_burst_is_one_handoff_and_each_caller_gets_its_own_output(engine):
    outs, (handoffs, requests) = asyncio.run(_counted(engine, [engine.async_generate(
        input_ids=PROMPT + [20 + i], sampling_params=_params(1 + i)) for i in range(12)]))
    assert (handoffs, requests) == (1, 12)  # all twelve issued in one turn of the loop
    assert [len(o["output_ids"]) for o in outs] == list(range(1, 13))
    assert len({o["meta_info"]["id"] for o in outs}) == 12


def test_errors_stay_with_their_own_request(engine):
    """A regex that fails to compile (in the scheduler) and a prompt over the context (before
    submission) fail alone; the requests beside them in the same burst complete."""
    calls = [engine.async_generate(input_ids=PROMPT, sampling_params=_params(3)),
             engine.async_generate(input_ids=PROMPT, sampling_params={
                 "regex": "(ab", "max_new_tokens": 3}),
             engine.async_generate(input_ids=PROMPT * 100, sampling_params=_params(3)),
             engine.async_generate(input_ids=PROMPT, sampling_params=_params(5))]
    (ok3, bad_regex, too_long, ok5), (handoffs, requests) = asyncio.run(_counted(engine, calls))
    assert isinstance(bad_regex, InvalidRequestError)
    assert isinstance(too_long, ContextLengthError)
    assert len(ok3["output_ids"]) == 3 and len(ok5["output_ids"]) == 5
    assert (handoffs, requests) == (1, 3)  # the over-long prompt never left the caller


def test_cancelling_one_aborts_only_it(engine):
    before = engine.stats()["generated_tokens_total"]

    async def go():
        keep = [asyncio.ensure_future(engine.async_generate(
            input_ids=PROMPT, sampling_params=_params(n))) for n in (4, 6)]
        drop = asyncio.ensure_future(engine.async_generate(
            input_ids=PROMPT, sampling_params=_params(LONG)))
        for _ in range(3):  # past the hand-off: the scheduler has it
            await asyncio.sleep(0)
        drop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drop
        return await asyncio.gather(*keep)
    outs = asyncio.run(go())
    assert [len(o["output_ids"]) for o in outs] == [4, 6]
    # an aborted request's tokens are not counted as generated: it did not run to its end
    assert engine.stats()["generated_tokens_total"] - before == 10


def test_each_result_arrives_when_its_own_request_finishes(engine):
    """Not when the slowest of its group does: the short request's answer is back while the
    long one still runs (then aborted, so the test does not wait for it)."""
    async def go():
        long = asyncio.ensure_future(engine.async_generate(
            input_ids=PROMPT, sampling_params=_params(LONG)))
        short = await engine.async_generate(input_ids=PROMPT, sampling_params=_params(1))
        still_running = not long.done()
        long.cancel()
        await asyncio.gather(long, return_exceptions=True)
        return short, still_running
    short, still_running = asyncio.run(go())
    assert len(short["output_ids"]) == 1 and still_running


def test_coalescing_off_sends_one_message_per_call(engine):
    """``disable_request_coalescing``: each call goes on its own (the path before coalescing).
    (The option is read per call, so the session's engine serves for both.)"""
    config = engine.config
    engine.config = config.replace(disable_request_coalescing=True)
    try:
        outs, counts = asyncio.run(_counted(engine, [engine.async_generate(
            input_ids=PROMPT, sampling_params=_params(2)) for _ in range(3)]))
    finally:
        engine.config = config
    assert [len(o["output_ids"]) for o in outs] == [2, 2, 2] and counts == (0, 0)

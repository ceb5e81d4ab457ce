"""``run_batch`` on ``Local`` over the real Engine (tiny random model): the programs' requests go
as single Engine calls started in one loop turn, their prompts tokenized in one call, so they
reach the scheduler in one hand-off as a list call would, and each program gets its result when
its own request finishes; the outputs are the ones the text prompts give. A prompt that does
not tokenize sends the burst as one list call of text, where only that program fails."""
from __future__ import annotations

import asyncio
import time

import pytest

import sgdsl as sgl
from sgdsl.backends import Local
from sgdsl.backends.base import BackendError


@sgl.function
def echo(s, prompt: str, budget: int):
    s += prompt
    s += sgl.gen("out", max_tokens=budget, temperature=0.0)


@pytest.fixture
def calls(engine, monkeypatch) -> list[dict]:
    """The keyword arguments of every ``async_generate`` call on ``engine``."""
    seen: list[dict] = []
    inner = engine.async_generate

    async def recording(**kwargs):
        seen.append(kwargs)
        return await inner(**kwargs)
    monkeypatch.setattr(engine, "async_generate", recording)
    return seen


def _batch(n: int) -> list[dict]:
    return [{"prompt": f"Item {i}: the {'quick ' * (i % 5)}brown fox, café №{i}",
             "budget": 1 + (i % 3) * 4} for i in range(n)]


def test_a_burst_reaches_the_scheduler_in_one_hand_off_as_token_ids(engine, calls):
    batch = _batch(40)
    before = engine.stats()
    states = echo.run_batch(batch, backend=Local(engine=engine))
    after = engine.stats()
    assert all(s.error() is None for s in states)
    assert after["submit_handoffs"] - before["submit_handoffs"] == 1
    assert after["submit_requests"] - before["submit_requests"] == 40
    assert len(calls) == 40 and all("prompt" not in c for c in calls)
    assert sorted(tuple(c["input_ids"]) for c in calls) == sorted(
        tuple(engine.tokenizer.encode(b["prompt"], add_special_tokens=False)) for b in batch)
    direct = engine.generate(prompt=[b["prompt"] for b in batch], sampling_params=[
        {"max_new_tokens": b["budget"], "temperature": 0.0} for b in batch])
    assert [s["out"] for s in states] == [o["text"] for o in direct]
    assert [s.get_meta_info("out")["prompt_tokens"] for s in states] == [
        o["meta_info"]["prompt_tokens"] for o in direct]


def test_a_prompt_that_does_not_tokenize_sends_the_burst_as_one_list_of_text(engine, calls):
    batch = _batch(12)
    batch[7]["prompt"] = ""  # no tokens: the Engine refuses it, as it would the text
    states = echo.run_batch(batch, backend=Local(engine=engine))
    # The programs run on threads: a thread switch can split the burst (seen 1 run in 4 on a
    # loaded box), and a group without the empty prompt then goes as token ids, one call per
    # program. The group that holds it must go as one list of text, and cover every program.
    # (The Engine's list call fans out to one call per prompt, recorded here too.)
    text = [c for c in calls if isinstance(c.get("prompt"), list)]
    assert len(text) == 1 and "" in text[0]["prompt"]
    singles = sum(isinstance(c.get("input_ids"), list) and not isinstance(c["input_ids"][0], list)
                  for c in calls)
    assert len(text[0]["prompt"]) + singles == 12
    error = states[7].error()
    assert isinstance(error, BackendError) and error.status == 400
    assert all(s.error() is None for k, s in enumerate(states) if k != 7)


def test_cancelling_a_burst_aborts_its_requests(engine):
    """``arun_batch`` cancelled while its single calls run: every request is aborted (far
    fewer tokens generated than asked for), and the engine ends idle, no KV held."""
    @sgl.function
    def long(s, prompt: str):
        s += prompt
        s += sgl.gen("out", max_tokens=400, ignore_eos=True)

    generated = engine.stats()["generated_tokens_total"]

    async def go():
        task = asyncio.ensure_future(long.arun_batch(
            [{"prompt": b["prompt"]} for b in _batch(24)], backend=Local(engine=engine)))
        while engine.stats()["num_running_reqs"] == 0:  # the burst reached the scheduler
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(go())
    deadline = time.monotonic() + 120  # the aborts land within a few scheduler steps
    while (engine.stats()["num_running_reqs"] + engine.stats()["num_waiting_reqs"]
           and time.monotonic() < deadline):
        time.sleep(0.02)
    assert engine.stats()["generated_tokens_total"] - generated < 24 * 400 // 2
    engine.check_idle_integrity()


def test_a_burst_reaches_the_engine_before_any_garbage_collection(engine, monkeypatch):
    """The collector is held off from ``run_batch``'s start until the batch is at the engine
    (its hand-off happens during the hold), and is back on when the batch returns."""
    import gc

    from sgdsl.interpreter import gc_pause

    monkeypatch.setattr(gc_pause, "MAX_PAUSE_S", 600.0)  # however slow the box
    from sgdsl.runtime.submitter import Submitter

    held: list[bool] = []
    inner = Submitter._flush

    def flush(self):  # the burst's hand-off to the engine's loop, on the caller's loop
        if self._pending:
            held.append(gc_pause.paused() and not gc.isenabled())
        return inner(self)
    monkeypatch.setattr(Submitter, "_flush", flush)
    states = echo.run_batch(_batch(24), backend=Local(engine=engine))
    assert all(s.error() is None for s in states)
    assert held == [True]
    assert gc.isenabled() and not gc_pause.paused()

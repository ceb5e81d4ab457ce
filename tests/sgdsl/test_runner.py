"""The execution machinery behind run_batch: the body runner (bodies back to back, handoff when
a body blocks), loop-call coalescing, run completion (forks included), inline text nodes."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import sgdsl as sgl
from sgdsl.interpreter.loop import LoopCalls
from sgdsl.interpreter.runner import BodyRunner
from sgdsl.interpreter.signal import Signal
from sgdsl.testing import ScriptedBackend


def _wait(event: threading.Event) -> None:
    assert event.wait(5), "timed out"


def test_bodies_that_do_not_block_run_back_to_back_on_the_calling_thread():
    runner = BodyRunner()
    threads: list[int] = []
    runner.run_here(lambda: [runner.submit(lambda: threads.append(threading.get_ident()))
                             for _ in range(50)])
    assert threads == [threading.get_ident()] * 50


def test_a_body_blocked_on_the_interpreter_hands_the_queue_to_another_thread():
    runner = BodyRunner(handoff_seconds=60)  # the monitor cannot be what saves it
    signal, state = Signal(), {"set": False}
    done = threading.Event()

    def waiter() -> None:  # queued first; waits for what the second body does
        signal.wait_for(lambda: state["set"])
        done.set()

    def setter() -> None:
        state["set"] = True
        signal.notify()
    runner.submit(waiter)
    runner.submit(setter)
    _wait(done)
    assert runner.monitor_handoffs == 0


def test_a_body_blocked_elsewhere_is_noticed_by_the_monitor():
    runner = BodyRunner()
    release, done = threading.Event(), threading.Event()
    runner.submit(lambda: (release.wait(5), done.set()))  # blocks outside the interpreter
    runner.submit(release.set)  # can only run if the monitor hands the queue over
    _wait(done)
    assert runner.monitor_handoffs >= 1


def test_loop_calls_run_in_order_with_few_wakeups():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        calls, seen = LoopCalls(loop), []
        wakeups = []
        original = calls._run
        calls._run = lambda: (wakeups.append(1), original())  # type: ignore[method-assign]
        finished, gate, busy = threading.Event(), threading.Event(), threading.Event()
        loop.call_soon_threadsafe(lambda: (busy.set(), gate.wait(5)))  # the loop is busy...
        _wait(busy)
        for i in range(200):  # ...while a burst of calls arrives
            calls(seen.append, i)
        calls(finished.set)
        gate.set()
        _wait(finished)
        assert seen == list(range(200))
        assert len(wakeups) == 1
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


async def test_arun_waits_for_forks_the_body_never_joined():
    backend = ScriptedBackend(outputs=lambda ctx, p, c: "done", hold=True)

    @sgl.function
    def prog(s):
        s += "q"
        forks = s.fork(2)
        forks += sgl.gen("a")  # never joined: the program is still running until they finish

    task = asyncio.ensure_future(prog.arun(backend=backend))
    await asyncio.sleep(0.05)
    assert not task.done()
    backend.release()
    state = await asyncio.wait_for(task, 5)
    assert all(ex.idle and ex.error_ is None for ex in state.stream_executor.run.executors)
    assert [ex.variables["a"] for ex in state.stream_executor.run.executors[1:]] == ["done", "done"]


async def test_arun_batch_keeps_at_most_max_concurrency_programs_running():
    running, peak = [0], [0]

    class SlowBackend(ScriptedBackend):
        async def generate(self, ctx, params, constraint=None):
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await asyncio.sleep(0.01)
            running[0] -= 1
            return await super().generate(ctx, params, constraint)

    @sgl.function
    def prog(s, i):
        s += str(i)
        s += sgl.gen("out")

    states = await prog.arun_batch([{"i": i} for i in range(12)], backend=SlowBackend(outputs=lambda *_: "x"),
                                   max_concurrency=3)
    assert [s["out"] for s in states] == ["x"] * 12
    assert peak[0] <= 3


def test_a_bad_role_sequence_fails_at_its_own_line_in_a_batch():
    @sgl.function
    def prog(s):
        s += "text"
        s += sgl.user_end()  # no user_begin
        s += "never appended"

    [state] = prog.run_batch([{}], backend=ScriptedBackend())
    assert isinstance(state.error(), ValueError)
    assert "never appended" not in state.stream_executor.text_


def test_run_batch_inside_a_program_body():
    backend = ScriptedBackend(outputs=lambda ctx, p, c: ctx.text[-1])

    @sgl.function
    def inner(s, ch):
        s += ch
        s += sgl.gen("out")

    @sgl.function
    def outer(s):
        states = inner.run_batch([{"ch": c} for c in "xyz"], backend=backend)
        s += "".join(st["out"] for st in states)

    states = outer.run_batch([{}, {}], backend=backend)
    assert [st.text() for st in states] == ["xyz", "xyz"]


def test_run_batch_state_errors_do_not_stop_the_batch():
    backend = ScriptedBackend(outputs=lambda ctx, p, c: "ok")

    @sgl.function
    def prog(s, fail):
        s += "a"
        if fail:
            raise KeyError("mine")
        s += sgl.gen("out")

    states = prog.run_batch([{"fail": i % 2 == 1} for i in range(6)], backend=backend)
    assert [type(s.error()).__name__ if s.error() else s["out"] for s in states] == \
        ["ok", "KeyError", "ok", "KeyError", "ok", "KeyError"]


@pytest.mark.parametrize("count", [0, 1, 300])
def test_run_batch_sizes(count: int):
    @sgl.function
    def prog(s, i):
        s += f"{i}:"
        s += sgl.gen("out")

    backend = ScriptedBackend(outputs=lambda ctx, p, c: ctx.text)
    states = prog.run_batch([{"i": i} for i in range(count)], backend=backend)
    assert [s["out"] for s in states] == [f"{i}:" for i in range(count)]


def test_switch_interval_is_lowered_while_a_burst_of_bodies_starts_then_restored():
    import sys

    from sgdsl.interpreter.runner import FAST_SWITCH_SECONDS

    before = sys.getswitchinterval()
    seen: list[float] = []
    runner = BodyRunner()
    runner.run_here(lambda: [runner.submit(lambda: seen.append(sys.getswitchinterval()))
                             for _ in range(3)])
    assert seen == [FAST_SWITCH_SECONDS] * 3
    deadline = time.monotonic() + 5
    while sys.getswitchinterval() != before and time.monotonic() < deadline:
        time.sleep(0.01)  # restored by the monitor after a short grace period
    assert sys.getswitchinterval() == before


def test_a_batch_restores_the_switch_interval_when_done_or_cancelled():
    import sys

    before = sys.getswitchinterval()
    backend = ScriptedBackend(outputs=lambda ctx, p, c: "x")

    @sgl.function
    def prog(s):
        s += "a"
        s += sgl.gen("out")

    list(prog.run_batch([{}] * 5, backend=backend, generator_style=True))
    iterator = prog.run_batch([{}] * 5, backend=backend, generator_style=True)
    next(iterator)  # abandoned half way: the batch still releases it when its programs end
    deadline = time.monotonic() + 5
    while sys.getswitchinterval() != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sys.getswitchinterval() == before


def test_when_idle_fires_once_every_body_has_returned_or_blocked():
    runner = BodyRunner(handoff_seconds=60)
    signal, state, fired = Signal(), {"go": False}, []
    idle = threading.Event()

    def waiter() -> None:  # blocks on the interpreter: does not keep the runner busy
        signal.wait_for(lambda: state["go"])

    runner.submit(waiter)  # on worker threads (run_here's caller would be the one blocked)
    for i in range(3):
        runner.submit(lambda i=i: fired.append(i))
    runner.when_idle(lambda: (fired.append("idle"), idle.set()))
    _wait(idle)
    assert fired == [0, 1, 2, "idle"]
    state["go"] = True
    signal.notify()
    seen = []
    runner.when_idle(lambda: seen.append("now"))  # idle already: called at once
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)  # the woken waiter may still be finishing
    assert seen == ["now"]


def test_a_batch_holds_the_collector_off_until_its_first_program_finishes():
    """While a batch's programs start (their requests built), no garbage collection runs (it
    delayed a 256-program burst's hand-off by 12-130 ms); after the first program finishes
    the collector is back on. A batch of one starts nothing in bulk: no hold."""
    import gc

    from sgdsl.interpreter import gc_pause

    seen: list[tuple[bool, bool]] = []  # (held off, collector on) at each request

    def outputs(ctx, p, c):
        seen.append((gc_pause.paused(), gc.isenabled()))
        return "x"

    collected: list[bool] = []  # whether a hold was active when a collection ran

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collected.append(gc_pause.paused())

    @sgl.function
    def prog(s, i):
        s += f"{i}:"
        s += sgl.gen("out")

    deadline = time.monotonic() + 10  # an earlier test's batch may still hold it briefly
    while gc_pause.paused() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc.isenabled() and not gc_pause.paused()
    gc.callbacks.append(on_gc)
    try:
        states = prog.run_batch([{"i": i} for i in range(300)],
                                backend=ScriptedBackend(outputs=outputs))
    finally:
        gc.callbacks.remove(on_gc)
    assert [s["out"] for s in states] == ["x"] * 300
    assert seen[0] == (True, False)  # the first request: built with the collector off
    assert True not in collected  # nothing collected while held off
    assert gc.isenabled() and not gc_pause.paused()
    seen.clear()
    prog.run_batch([{"i": 0}], backend=ScriptedBackend(outputs=outputs))
    assert seen == [(False, True)]


def test_the_collector_hold_counts_its_holders_and_keeps_a_callers_choice():
    import gc

    from sgdsl.interpreter import gc_pause

    first, second = gc_pause.pause_gc(), gc_pause.pause_gc()
    assert not gc.isenabled()
    first()
    first()  # a second resume of the same hold does nothing
    assert not gc.isenabled() and gc_pause.paused()
    second()
    assert gc.isenabled() and not gc_pause.paused()
    gc.disable()  # the caller's own choice survives a batch
    try:
        backend = ScriptedBackend(outputs=lambda ctx, p, c: "x")

        @sgl.function
        def prog(s):
            s += sgl.gen("out")
        prog.run_batch([{}] * 5, backend=backend)
        assert not gc.isenabled()
    finally:
        gc.enable()

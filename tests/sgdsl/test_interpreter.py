"""Interpreter semantics on the scripted backend: ordering, roles, fork/join, var_scope,
errors with the program's line, cancellation, streaming."""
from __future__ import annotations

import asyncio
import threading

import pytest

import sgdsl as sgl
from sgdsl.chat_template import get_chat_template
from sgdsl.errors import ProgramCancelledError
from sgdsl.testing import ScriptedBackend


def test_roles_render_with_the_backend_template_and_messages():
    backend = ScriptedBackend(outputs=["Paris"], template=get_chat_template("chatml"))

    @sgl.function
    def qa(s, question):
        s += sgl.system("Be brief.")
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=8))

    state = qa.run(question="Capital of France?", backend=backend)
    assert state["answer"] == "Paris"
    assert state.text() == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                            "Capital of France?<|im_end|>\n<|im_start|>assistant\nParis<|im_end|>\n")
    assert state.messages()[-1] == {"role": "assistant", "content": "Paris"}
    call = backend.calls[0]
    assert call.context.open_role == "assistant"
    assert call.context.text.endswith("<|im_start|>assistant\n")
    assert call.params.max_tokens == 8 and "<|im_end|>" in call.params.stop


def test_program_wide_defaults_fill_unset_gen_params():
    backend = ScriptedBackend(outputs=["a", "b"])

    @sgl.function
    def prog(s):
        s += sgl.gen("x") + sgl.gen("y", temperature=0.5)

    prog.run(backend=backend, temperature=0.1, max_new_tokens=7)
    assert [c.params.temperature for c in backend.calls] == [0.1, 0.5]
    assert [c.params.max_tokens for c in backend.calls] == [7, 7]


def test_end_of_turn_stop_only_inside_a_role():
    backend = ScriptedBackend(outputs=["a", "b"], template=get_chat_template("chatml"))

    @sgl.function
    def prog(s):
        s += "plain " + sgl.gen("x", max_tokens=4)
        s += sgl.assistant(sgl.gen("y", max_tokens=4))

    prog.run(backend=backend)
    assert "<|im_end|>" not in backend.calls[0].params.resolved("stop")
    assert "<|im_end|>" in backend.calls[1].params.resolved("stop")


def test_a_program_parameter_named_like_a_sampling_field_stays_an_argument():
    backend = ScriptedBackend(outputs=["a"])

    @sgl.function
    def prog(s, max_tokens):
        s += f"budget {max_tokens}:" + sgl.gen("x", max_tokens=max_tokens)

    state = prog.run(backend=backend, max_tokens=3, temperature=0.2)
    assert backend.calls[0].context.text.endswith("budget 3:")
    assert backend.calls[0].params.max_tokens == 3
    assert backend.calls[0].params.temperature == 0.2
    assert state["x"] == "a"


def test_fork_gather_variable_and_concat():
    backend = ScriptedBackend(outputs=lambda ctx, p, c: f"<{ctx.text.count('tip')}>")

    @sgl.function
    def tips(s):
        s += "list:"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += f" tip{i}="
            f += sgl.gen("tip")
        forks.join()
        s += "|"
        more = s.fork(2)
        more += sgl.gen("extra")
        more.join("concate_and_append")

    state = tips.run(backend=backend)
    assert state["tip"] == ["<1>", "<1>", "<1>"]
    assert state.text() == "list:|<0><0>"
    assert any(c.kind == "cache" for c in backend.calls)  # fork(n>1) commits the shared prefix


def test_copy_and_var_scope():
    backend = ScriptedBackend(outputs=["one", "two"])

    @sgl.function
    def prog(s):
        with s.var_scope("scoped"):
            s += "A " + sgl.gen("x")
        with s.copy() as c:
            c += sgl.gen("side")
        s += " end"

    state = prog.run(backend=backend)
    assert state["scoped"] == "A one"
    assert state["side"] == ["two"]
    assert state.text() == "A one end"


def test_role_context_managers_and_nested_role_error():
    backend = ScriptedBackend(outputs=["hi"])

    @sgl.function
    def prog(s):
        with s.user():
            s += "hello"
        with s.assistant():
            s += sgl.gen("r")

    assert [m["role"] for m in prog.run(backend=backend).messages()] == ["user", "assistant"]

    @sgl.function
    def nested(s):
        s += sgl.user_begin()
        s += sgl.assistant_begin()
        s += "never"

    with pytest.raises(ValueError, match="nested roles"):
        nested.run(backend=ScriptedBackend())


def test_backend_error_surfaces_as_itself_with_the_program_line():
    backend = ScriptedBackend(fail_with=ConnectionError("boom"))

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a")  # the failing line
        s += sgl.gen("b")

    with pytest.raises(ConnectionError, match="boom") as info:
        prog.run(backend=backend)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "test_interpreter.py" in notes and "the failing line" in notes
    assert "gen('a')" in notes


def test_reading_a_variable_of_a_failed_program_raises_the_error_not_keyerror():
    backend = ScriptedBackend(fail_with=TimeoutError("slow"))

    @sgl.function
    def prog(s):
        s += sgl.gen("a")

    [state] = prog.run_batch([{}], backend=backend)
    assert isinstance(state.error(), TimeoutError)
    with pytest.raises(TimeoutError):
        state["a"]


def test_body_sees_the_error_at_its_next_append():
    backend = ScriptedBackend(fail_with=RuntimeError("bad"))
    reached = []

    @sgl.function
    def prog(s):
        s += sgl.gen("a")
        s["a"]  # waits for a, which fails
        reached.append(True)

    with pytest.raises(RuntimeError, match="bad"):
        prog.run(backend=backend)
    assert reached == []


async def test_cancelling_arun_aborts_the_in_flight_call():
    backend = ScriptedBackend(outputs=["never"], hold=True)

    @sgl.function
    def prog(s):
        s += sgl.gen("a")
        s += sgl.gen("b")

    task = asyncio.create_task(prog.arun(backend=backend))
    await asyncio.wait_for(backend.wait_started(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if backend.aborted:
            break
        await asyncio.sleep(0.01)
    assert backend.aborted == 1
    assert len(backend.calls) == 1  # gen("b") never ran


def test_cancel_from_another_thread_stops_the_body():
    backend = ScriptedBackend(outputs=["x"], hold=True)
    errors, seen = [], threading.Event()

    @sgl.function
    def prog(s):
        s += sgl.gen("a")
        try:
            s["a"]
        except ProgramCancelledError as exc:
            errors.append(exc)
            seen.set()
            raise

    state = prog.run(backend=backend, stream=True)
    threading.Timer(0.2, state.cancel).start()
    with pytest.raises(ProgramCancelledError):
        list(state.text_iter())
    assert seen.wait(10) and isinstance(errors[0], ProgramCancelledError)


def test_streaming_text_iter_by_variable_and_whole_text():
    backend = ScriptedBackend(outputs=["the quick brown fox"])

    @sgl.function
    def prog(s):
        s += "Q: "
        s += sgl.gen("a")

    state = prog.run(backend=backend, stream=True)
    chunks = list(state.text_iter("a"))
    assert "".join(chunks) == "the quick brown fox"
    assert backend.calls[0].kind == "stream"
    state2 = prog.run(backend=ScriptedBackend(outputs=["a b"]), stream=True)
    assert "".join(state2.text_iter()) == "Q: a b"


async def test_text_async_iter_with_meta():
    backend = ScriptedBackend(outputs=["one two"])

    @sgl.function
    def prog(s):
        s += sgl.gen("a")

    state = prog.run(backend=backend, stream=True)
    out = [item async for item in state.text_async_iter("a", return_meta_data=True)]
    assert "".join(chunk for chunk, _ in out) == "one two"
    assert state.get_meta_info("a")["completion_tokens"] == 2


async def test_arun_and_arun_batch_limit_concurrency():
    backend = ScriptedBackend(outputs=lambda ctx, p, c: ctx.text.upper())

    @sgl.function
    def shout(s, word):
        s += word + ":"
        s += sgl.gen("out")

    state = await shout.arun(word="hi", backend=backend)
    assert state["out"] == "HI:"
    states = await shout.arun_batch([{"word": w} for w in "abc"], backend=backend, max_concurrency=2)
    assert [s["out"] for s in states] == ["A:", "B:", "C:"]


def test_run_batch_orders_results_and_generator_style():
    backend = ScriptedBackend(outputs=lambda ctx, p, c: ctx.text[::-1])

    @sgl.function
    def rev(s, text):
        s += text
        s += sgl.gen("r")

    batch = [{"text": t} for t in ("abc", "xy", "q")]
    assert [s["r"] for s in rev.run_batch(batch, backend=backend, num_threads=2)] == ["cba", "yx", "q"]
    gen_states = rev.run_batch(batch, backend=backend, generator_style=True, progress_bar=True)
    assert [s["r"] for s in gen_states] == ["cba", "yx", "q"]


def test_gen_n_without_native_n_issues_n_requests():
    backend = ScriptedBackend(outputs=["a", "b", "c"])

    @sgl.function
    def prog(s):
        s += sgl.gen("x", n=3)

    state = prog.run(backend=backend)
    assert sorted(state["x"]) == ["a", "b", "c"]
    assert len(backend.calls) == 3 and all(c.params.n == 1 for c in backend.calls)
    assert state.text() == state["x"][0]
    assert state.get_meta_info("x")["completion_tokens"] == 3
    usage = state.usage()
    assert (usage["calls"], usage["completion_tokens"]) == (3, 3) and usage["cost"] == pytest.approx(0.003)


def test_bind_and_nested_call():
    backend = ScriptedBackend(outputs=["ok"])

    @sgl.function
    def inner(s, tag):
        s += f"[{tag}]"

    @sgl.function
    def outer(s, tag, suffix):
        inner(s, tag)
        s += suffix + sgl.gen("g")

    state = outer.bind(tag="T").run(suffix="!", backend=backend)
    assert state.text() == "[T]!ok"


def test_usage_sums_over_forks():
    backend = ScriptedBackend(outputs=["a b", "c", "d"])

    @sgl.function
    def prog(s):
        s += sgl.gen("x")
        forks = s.fork(2)
        forks += sgl.gen("y")
        forks.join()

    assert prog.run(backend=backend).usage()["completion_tokens"] == 4


async def test_text_async_iter_without_stream_yields_the_final_text():
    backend = ScriptedBackend(outputs=["done"])

    @sgl.function
    def prog(s):
        s += "A:" + sgl.gen("a")

    state = prog.run(backend=backend)
    assert [t async for t in state.text_async_iter()] == ["A:done"]
    assert [t async for t in state.text_async_iter("a")] == ["done"]


async def test_arun_stream_returns_at_once_and_streams():
    backend = ScriptedBackend(outputs=["x y z"])

    @sgl.function
    def prog(s):
        s += "go:" + sgl.gen("a")

    state = await prog.arun(backend=backend, stream=True)
    chunks = [c async for c in state.text_async_iter("a")]
    assert "".join(chunks) == "x y z" and backend.calls[0].kind == "stream"

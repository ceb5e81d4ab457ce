"""The HTML view of a ProgramState."""
from __future__ import annotations

import sgdsl as sgl
from sgdsl.chat_template import get_chat_template
from sgdsl.testing import ScriptedBackend


def test_repr_html_shows_roles_and_highlights_generated_spans():
    backend = ScriptedBackend(outputs=["<b>Paris</b>"], template=get_chat_template("chatml"))

    @sgl.function
    def qa(s):
        s += sgl.user("Capital?")
        s += sgl.assistant(sgl.gen("answer"))

    html = qa.run(backend=backend)._repr_html_()
    assert "<|im_start|>" not in html  # template markup is hidden
    assert ">user<" in html and ">assistant<" in html
    assert 'title="answer">&lt;b&gt;Paris&lt;/b&gt;</span>' in html  # escaped, highlighted


def test_repr_html_shows_the_error():
    @sgl.function
    def prog(s):
        s += sgl.gen("x")

    [state] = prog.run_batch([{}], backend=ScriptedBackend(fail_with=ValueError("nope")))
    assert "ValueError: nope" in state._repr_html_()


def test_live_display_updates_until_the_program_finishes(monkeypatch):
    import threading

    import IPython.display

    updates, finished = [], threading.Event()

    class Handle:
        def update(self, obj):
            updates.append(obj.data)
            if "running" not in obj.data:
                finished.set()

    monkeypatch.setattr(IPython.display, "display", 
                        lambda obj, display_id=False: (updates.append(obj.data), Handle())[1])
    backend = ScriptedBackend(outputs=["streamed words here"], hold=True)

    @sgl.function
    def prog(s):
        s += sgl.gen("x")

    state = prog.run(backend=backend, stream=True)
    state.display()
    state.stream_executor.run.loop.call_soon_threadsafe(backend.release)
    assert finished.wait(10)
    assert "running" in updates[0] and "streamed words here" in updates[-1]

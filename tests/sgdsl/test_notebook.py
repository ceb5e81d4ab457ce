"""The notebook view of a ProgramState: structure of the HTML (parsed, not string-matched where
structure matters), the call details, forks, errors, the live refresh and progress bars."""
from __future__ import annotations

import sys
import threading
from html.parser import HTMLParser

import pytest

import sgdsl as sgl
from sgdsl.chat_template import get_chat_template
from sgdsl.testing import ScriptedBackend

CHATML = get_chat_template("chatml")
RUNNING = '<div class="sgdsl-running">'  # shown while the program runs


class _Tree(HTMLParser):
    """Elements with their classes, attributes and direct text, in document order."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[dict] = []
        self._stack: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": "", "parent": self._stack[-1] if self._stack else None}
        el["classes"] = set((el["attrs"].get("class") or "").split())
        self.elements.append(el)
        if tag not in ("img", "br"):
            self._stack.append(el)

    def handle_endtag(self, tag):
        while self._stack and self._stack.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        for el in self._stack:
            el["text"] += data

    def by_class(self, cls: str) -> list[dict]:
        return [e for e in self.elements if cls in e["classes"]]


def _qa(backend, **kwargs):
    @sgl.function
    def qa(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Capital?")
        s += sgl.assistant(sgl.gen("answer", **kwargs))
        s += sgl.user("Sure?")
        s += sgl.assistant(sgl.gen("sure"))

    return qa.run(backend=backend)


def test_each_turn_renders_once_with_its_role():
    state = _qa(ScriptedBackend(outputs=["<b>Paris</b>", "yes"], template=CHATML))
    tree = _Tree(state._repr_html_())
    turns = tree.by_class("sgdsl-turn")
    assert [t["attrs"]["data-role"] for t in turns] == ["system", "user", "assistant", "user", "assistant"]
    assert all(t["text"].strip() for t in turns)  # no empty block after a turn
    assert "<|im_start|>" not in state._repr_html_() and "<|im_end|>" not in state._repr_html_()


def test_generated_spans_are_escaped_highlighted_and_titled():
    state = _qa(ScriptedBackend(outputs=["<b>Paris</b>", "yes"], template=CHATML))
    html = state._repr_html_()
    spans = _Tree(html).by_class("sgdsl-gen")
    assert [(s["attrs"]["title"], s["text"]) for s in spans] == [("answer", "<b>Paris</b>"), ("sure", "yes")]
    assert "&lt;b&gt;Paris" in html and "<b>Paris" not in html


def test_call_panel_shows_tokens_probabilities_forced_tokens_and_grammar():
    logprobs = [[-0.1, 11, "Par"], [-2.3, 12, "is"], [0.0, 13, "!"]]
    backend = ScriptedBackend(outputs=["Paris!", "yes"], template=CHATML, extra_meta={
        "output_token_logprobs": logprobs, "forced_token_positions": [2], "cached_tokens": 2})
    state = _qa(backend, regex=r"[A-Za-z!]+")
    tree = _Tree(state._repr_html_())
    panels = tree.by_class("sgdsl-call")
    assert [p["attrs"]["data-var"] for p in panels] == ["answer", "sure"]
    assert panels[0]["tag"] == "details" and "open" not in panels[0]["attrs"]  # collapsed
    tokens = [t for t in tree.by_class("sgdsl-token") if t["parent"]["parent"] is panels[0]]
    assert [t["text"] for t in tokens] == ["Par", "is", "!"]
    assert "p=0.905" in tokens[0]["attrs"]["title"] and "token 11" in tokens[0]["attrs"]["title"]
    assert ["sgdsl-forced" in t["classes"] for t in tokens] == [False, False, True]
    assert "forced by the grammar" in tokens[2]["attrs"]["title"]
    grammar = [g for g in tree.by_class("sgdsl-grammar") if g["parent"] is panels[0]]
    assert grammar and "regex" in grammar[0]["text"] and "[A-Za-z!]+" in grammar[0]["text"]
    facts = panels[0]["text"]
    assert "cached prompt tokens" in facts and "forced tokens (jump-forward)" in facts
    assert "stop" in facts and "latency" in facts


def test_call_panel_without_logprobs_has_no_token_view():
    state = _qa(ScriptedBackend(outputs=["Paris", "yes"], template=CHATML))
    tree = _Tree(state._repr_html_())
    assert not tree.by_class("sgdsl-token") and len(tree.by_class("sgdsl-call")) == 2


def test_retries_and_unnamed_calls_are_reported():
    outputs = iter(["not json", '{"a": 1}'])
    backend = ScriptedBackend(outputs=lambda *_: next(outputs))
    backend.capabilities = sgl.backends.base.Capabilities()  # no native constraints: retry

    @sgl.function
    def prog(s):
        s += sgl.gen(json_schema={"type": "object"}, max_tokens=8)

    tree = _Tree(prog.run(backend=backend)._repr_html_())
    [panel] = tree.by_class("sgdsl-call")
    assert "(unnamed)" in panel["text"] and "attempts (validate-and-retry)" in panel["text"]
    assert "last parse error" not in panel["text"]  # the second attempt was valid


def test_summary_line_counts_calls_tokens_cache_and_cost():
    backend = ScriptedBackend(outputs=["Paris", "yes"], template=CHATML, extra_meta={"cached_tokens": 1})
    [summary] = _Tree(_qa(backend)._repr_html_()).by_class("sgdsl-summary")
    text = summary["text"]
    assert text.startswith("2 calls") and "completion tokens" in text
    assert "cache hit" in text and "$0.002000" in text


def test_error_is_shown_in_place_with_the_program_line():
    @sgl.function
    def prog(s):
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("x"))

    [state] = prog.run_batch([{}], backend=ScriptedBackend(fail_with=ValueError("nope"), template=CHATML))
    tree = _Tree(state._repr_html_())
    [error] = tree.by_class("sgdsl-error")
    assert "ValueError: nope" in error["text"]
    assert "test_notebook.py" in error["text"] and 's += sgl.assistant(sgl.gen("x"))' in error["text"]
    assert [t["attrs"]["data-role"] for t in tree.by_class("sgdsl-turn")][0] == "user"


def test_forks_render_side_by_side_with_their_join():
    backend = ScriptedBackend(outputs=["A", "B"], template=CHATML)

    @sgl.function
    def prog(s):
        s += sgl.user("Pick")
        forks = s.fork(2)
        forks += sgl.assistant(sgl.gen("pick"))
        forks.join()

    tree = _Tree(prog.run(backend=backend)._repr_html_())
    [row] = tree.by_class("sgdsl-forks")
    columns = [c for c in tree.by_class("sgdsl-fork") if c["parent"] is row]
    assert len(columns) == 2
    picks = sorted(s["text"] for s in tree.by_class("sgdsl-gen"))
    assert picks == ["A", "B"]
    assert any("joined (gather_variable)" in e["text"] for e in tree.by_class("sgdsl-fork-label"))


def test_images_render_inline():
    from sgdsl.backends.base import Capabilities

    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")
    backend = ScriptedBackend(outputs=["a dot"], template=CHATML,
                              capabilities=Capabilities(images=True))

    @sgl.function
    def prog(s):
        s += sgl.user(sgl.image(png) + "What is this?")
        s += sgl.assistant(sgl.gen("what"))

    tree = _Tree(prog.run(backend=backend)._repr_html_())
    [img] = [e for e in tree.elements if e["tag"] == "img"]
    assert img["attrs"]["src"].startswith("data:image/png;base64,iVBOR")
    assert img["parent"]["attrs"]["data-role"] == "user"


def test_live_display_updates_until_the_program_finishes(monkeypatch):
    import IPython.display

    updates, finished = [], threading.Event()

    class Handle:
        def update(self, obj):
            updates.append(obj.data)
            if RUNNING not in obj.data:
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
    assert RUNNING in updates[0] and "streamed words here" in updates[-1]


@pytest.fixture
def fake_kernel(monkeypatch):
    """IPython looks like a notebook kernel; displays are recorded."""
    import IPython
    import IPython.display

    shown = []

    class Handle:
        def update(self, obj):
            shown.append(repr(obj))

    class Shell:
        kernel = object()

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    monkeypatch.setattr(IPython.display, "display",
                        lambda obj, display_id=False: (shown.append(repr(obj)), Handle())[1])
    return shown


def test_progress_in_a_notebook_without_ipywidgets_is_one_clean_line(fake_kernel, monkeypatch, recwarn, capsys):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    from sgdsl.notebook.progress import LineProgress, progress_bar

    bar = progress_bar(3)
    assert isinstance(bar, LineProgress)
    for _ in range(3):
        bar.update()
    bar.close()
    assert fake_kernel[0].startswith("run_batch:   0% 0/3") and fake_kernel[-1].startswith("run_batch: 100% 3/3")
    assert not recwarn.list and capsys.readouterr().err == ""


def test_progress_in_a_notebook_with_ipywidgets_is_a_widget(fake_kernel):
    pytest.importorskip("ipywidgets", reason="the notebook extra installs ipywidgets")
    from tqdm.notebook import tqdm as notebook_tqdm

    from sgdsl.notebook.progress import progress_bar

    bar = progress_bar(2)
    assert isinstance(bar, notebook_tqdm)
    bar.close()


def test_progress_in_a_terminal_is_tqdm_text():
    from tqdm.std import tqdm

    from sgdsl.notebook.progress import progress_bar

    bar = progress_bar(1)
    assert type(bar) is tqdm
    bar.close()

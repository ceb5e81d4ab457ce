"""The notebook experience as a person has it: a notebook executed headless by a real Jupyter
kernel (nbclient) with the embedded model, its rendered outputs checked for structure, and the
same HTML opened in a real browser (headless Chromium through Playwright) to check what a reader
sees: one block per turn, highlighted generated spans, and the token view opening on a click."""
from __future__ import annotations

import os
import shutil
from html.parser import HTMLParser

import pytest
from e2e_notebook import executed_notebook

pytestmark = pytest.mark.slow
nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat")
nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbclient")

PROGRAM = '''
import sgdsl as sgl

@sgl.function
def qa(s, question):
    s += sgl.system("Answer in a few words.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, temperature=0, return_logprob=True,
                               return_text_in_logprobs=True))
'''
CELLS = [PROGRAM,
         'state = qa.run(question="What is the capital of France?")\nstate',
         'states = qa.run_batch([{"question": "Hi"}, {"question": "Name a color."}], progress_bar=True)\n'
         'print(len(states), "done")']
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def executed():
    return executed_notebook(CELLS)


def _classes(html: str, cls: str) -> list[dict]:
    found: list[dict] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if cls in (attrs.get("class") or "").split():
                found.append(attrs)

    Parser().feed(html)
    return found


def test_state_cell_renders_one_block_per_turn_with_the_token_view(executed):
    [out] = [o for o in executed.cells[1].outputs if o.output_type == "execute_result"]
    html = out.data["text/html"]
    assert [t["data-role"] for t in _classes(html, "sgdsl-turn")] == ["system", "user", "assistant"]
    [span] = _classes(html, "sgdsl-gen")
    assert span["data-var"] == "answer"
    assert len(_classes(html, "sgdsl-call")) == 1
    tokens = _classes(html, "sgdsl-token")
    assert 1 <= len(tokens) <= 6 and all(t["title"].startswith("token ") and "p=" in t["title"]
                                         for t in tokens)
    assert "<|im_start|>" not in html and len(_classes(html, "sgdsl-summary")) == 1


def test_progress_bar_is_a_widget_and_prints_no_warning(executed):
    outputs = executed.cells[2].outputs
    assert not [o for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert any(WIDGET_MIME in o.get("data", {}) for o in outputs if o.output_type == "display_data")
    assert any(o.output_type == "stream" and "2 done" in o.text for o in outputs)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def page(tmp_path):
    if _chromium() is None:
        pytest.skip("headless Chromium is not installed (Debian package 'chromium'; .ci/run installs "
                    "it where apt-get is available)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield browser.new_page(viewport={"width": 900, "height": 700})
        browser.close()


def test_a_reader_sees_turns_highlighted_spans_and_toggles_the_token_view(executed, page, tmp_path):
    [out] = [o for o in executed.cells[1].outputs if o.output_type == "execute_result"]
    path = tmp_path / "view.html"
    path.write_text(f"<!doctype html><meta charset=utf-8><body>{out.data['text/html']}</body>")
    page.goto(path.as_uri())
    turns = page.locator(".sgdsl-turn")
    assert turns.count() == 3 and all(turns.nth(i).is_visible() for i in range(3))
    assert [turns.nth(i).locator(".sgdsl-role").inner_text() for i in range(3)] == [
        "system", "user", "assistant"]
    span = page.locator(".sgdsl-gen")
    assert span.count() == 1 and span.is_visible()
    assert span.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(255, 243, 176)"
    token = page.locator(".sgdsl-token").first
    assert not token.is_visible()  # collapsed until asked for
    page.locator(".sgdsl-call summary").click()
    assert token.is_visible()
    shot = os.environ.get("SGDSL_NOTEBOOK_SCREENSHOT")  # docs/notebook_view.png is made this way
    if shot:
        page.screenshot(path=shot, full_page=True)

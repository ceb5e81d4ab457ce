"""``sgl.separate_reasoning``: the think section in ``x_reasoning_content``, the answer in
``x`` and in the text, with plain and streamed runs; the splitter on its own."""
from __future__ import annotations

import pytest

import sgdsl as sgl
from sgdsl.reasoning import ReasoningSplitter, split_reasoning
from sgdsl.testing import ScriptedBackend

QWEN = "<think>\nFirst 2+2.\nThat is 4.\n</think>\n\nThe answer is 4."


@sgl.function
def ask(s, model_type):
    s += sgl.user("2+2?")
    s += sgl.assistant(sgl.separate_reasoning(sgl.gen("answer", max_tokens=64), model_type))
    s += sgl.user("Thanks")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model_type,output,reasoning,answer", [
    ("qwen3", QWEN, "First 2+2.\nThat is 4.", "The answer is 4."),
    ("deepseek-r1", "Adding.\n</think>\n\n4", "Adding.", "4"),
    ("qwen3", "Just 4.", "", "Just 4."),
    ("deepseek-r1", "Still thinking when cut", "Still thinking when cut", ""),
])
def test_reasoning_and_answer_in_separate_variables(stream, model_type, output, reasoning,
                                                    answer):
    state = ask.run(model_type, backend=ScriptedBackend(outputs=[output]), stream=stream)
    if stream:
        pieces = list(state.text_iter("answer"))
        assert "".join(pieces) == answer
    assert state["answer"] == answer
    assert state["answer_reasoning_content"] == reasoning
    assert state.get_meta_info("answer")["reasoning_content"] == reasoning
    assert "<think>" not in state.text() and answer in state.text()
    assert state.messages()[1] == {"role": "assistant", "content": answer}


def test_default_model_type_and_unknown_one():
    state = ask.run(None, backend=ScriptedBackend(outputs=["r</think>a"]))
    assert (state["answer_reasoning_content"], state["answer"]) == ("r", "a")
    with pytest.raises(ValueError, match="unknown reasoning model_type"):
        sgl.separate_reasoning(sgl.gen("x"), "nope")


@pytest.mark.parametrize("text,model_type", [
    (QWEN, "qwen3"), ("Adding.\n</think>\n\n4", "deepseek-r1"), ("plain", "qwen3"),
    ("<think>never closed", "qwen3"), ("<thi", "qwen3"), ("a</thi", "deepseek-r1")])
def test_streamed_split_equals_the_whole_split(text, model_type):
    splitter = ReasoningSplitter(model_type)
    parts = [splitter.push(ch) for ch in text] + [splitter.finish()]
    assert ("".join(r for r, _ in parts), "".join(a for _, a in parts)) == \
        split_reasoning(text, model_type)

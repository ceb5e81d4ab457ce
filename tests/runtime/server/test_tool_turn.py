"""tool_turn on scripted outputs (the fake engine writes a fixed assistant answer, one
character per token): auto calls opened mid-answer, forced calls, reasoning sections of both
parsers, in stream and non-stream, and the same through the HTTP routes."""
from __future__ import annotations

import asyncio
import json
import sys
import os
from typing import Any

import pytest

from sgdsl.runtime.function_call import get_format
from sgdsl.runtime.server.args import ServerArgs
from sgdsl.runtime.server.context import ServerContext
from sgdsl.runtime.server.reasoning import get_reasoning_format
from sgdsl.runtime.server.tool_turn import (ArgsDelta, CallStart, ReasoningDelta, TextDelta,
                                            TurnEnd, run_turn)
from sgdsl.runtime.server.tools import Tool, plan_tools, render_prompt

sys.path.insert(0, os.path.dirname(__file__))
from fake_engine import FakeEngine  # noqa: E402

CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
TOOLS = [Tool("get_weather", {"type": "object"}), Tool("get_time", {"type": "object"})]


def _turn(script: str, mode: str | None = "auto", reasoning: str | None = None,
          stream: bool = False, max_new_tokens: int = 200) -> list[Any]:
    engine = FakeEngine(step_s=0, script=script, context=8192)
    c = ServerContext.build(engine, ServerArgs())
    plan = plan_tools(TOOLS, mode, get_format("hermes")) if mode else None
    prompt = render_prompt(c.chat_template, [{"role": "user", "content": "hi"}], plan)

    async def go() -> list[Any]:
        return [e async for e in run_turn(c, prompt, {"max_new_tokens": max_new_tokens}, plan,
                                          get_reasoning_format(reasoning), stream)]
    events = asyncio.run(go())
    assert not engine.running
    return events


def _joined(events: list[Any], kind: type) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


@pytest.mark.parametrize("stream", [False, True])
def test_auto_call_opened_mid_answer_is_constrained_and_streamed(stream) -> None:
    events = _turn("Let me check.<tool_call>\n" + CALL, stream=stream)
    end = events[-1]
    assert isinstance(end, TurnEnd) and end.reason == "tool_calls"
    assert end.text == "Let me check." == _joined(events, TextDelta)
    (call,) = end.calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "Paris", "days": [1, 2]}
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [s.name for s in starts] == ["get_weather"]
    assert _joined(events, ArgsDelta) == call.arguments
    assert end.completion_tokens == len("Let me check.<tool_call>") + len(CALL)


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_plain_answers(stream) -> None:
    end = _turn("<tool_call>\n" + CALL, mode="required", stream=stream)[-1]
    assert end.reason == "tool_calls" and end.calls[0].name == "get_weather" and end.text == ""
    plain = _turn("No tools needed.", stream=stream)
    assert plain[-1].reason == "stop" and plain[-1].calls == ()
    assert plain[-1].text == "No tools needed." == _joined(plain, TextDelta)


def test_call_cut_by_max_tokens_keeps_what_was_written() -> None:
    end = _turn("<tool_call>\n" + CALL, mode="required", max_new_tokens=45)[-1]
    assert end.reason == "length" and end.calls[0].name == "get_weather"
    assert CALL.startswith('{"name": "get_weather", "arguments": ' + end.calls[0].arguments)
    end = _turn("<tool_call>\n" + CALL, mode="required", max_new_tokens=5)[-1]
    assert end.reason == "length" and end.calls == () and end.text == "<tool_call>\n" + CALL[:5]


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_then_call(stream) -> None:
    events = _turn("<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n" + CALL,
                   reasoning="qwen3", stream=stream)
    end = events[-1]
    assert end.reasoning == "The user wants weather." == _joined(events, ReasoningDelta)
    assert end.text == "" and end.calls[0].name == "get_weather"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("parser,script,thought,answer", [
    ("qwen3", "<think>\nStep 1. Step 2.\n</think>\n\nThe answer is 4.", "Step 1. Step 2.",
     "The answer is 4."),
    ("deepseek-r1", "Hmm, 2+2.\n</think>\n\n4", "Hmm, 2+2.", "4"),
    ("qwen3", "Just 4.", None, "Just 4."),  # no section: answered again after an empty one
])
def test_reasoning_split(stream, parser, script, thought, answer) -> None:
    events = _turn(script, mode=None, reasoning=parser, stream=stream)
    end = events[-1]
    assert end.reasoning == thought and end.text == answer
    assert _joined(events, ReasoningDelta) == (thought or "")
    assert _joined(events, TextDelta) == answer


def test_reasoning_cut_by_max_tokens() -> None:
    end = _turn("<think>\nA long thought that goes on", mode=None, reasoning="qwen3",
                max_new_tokens=22)[-1]
    assert end.reason == "length" and end.text == "" and end.reasoning == "A long thought"


def test_reasoning_through_the_openai_and_anthropic_routes() -> None:
    """reasoning_content (its own stream deltas) and thinking blocks, official clients."""
    import anthropic
    import openai

    from sgdsl.runtime.server.app import create_app
    from sgdsl.runtime.server.thread_server import ThreadServer

    engine = FakeEngine(step_s=0, script="<think>\nAdd them.\n</think>\n\n4", context=8192)
    server = ThreadServer(create_app(engine, ServerArgs(reasoning_parser="qwen3")))
    url = server.start()
    try:
        oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        kw = dict(model="fake-model", messages=[{"role": "user", "content": "2+2?"}],
                  max_tokens=64)
        msg = oai.chat.completions.create(**kw).choices[0].message
        assert msg.content == "4" and msg.model_extra["reasoning_content"] == "Add them."
        chunks = list(oai.chat.completions.create(stream=True, **kw))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "Add them."
        assert "".join(d.content or "" for d in deltas) == "4"
        plain = oai.chat.completions.create(extra_body={"separate_reasoning": False}, **kw)
        assert plain.choices[0].message.content.startswith("<think>")
        ant = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        out = ant.messages.create(**kw)
        assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
                for b in out.content] == [("thinking", "Add them."), ("text", "4")]
        with ant.messages.stream(**kw) as stream:
            final = stream.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[0].thinking == "Add them." and final.content[1].text == "4"
    finally:
        server.stop()
    assert not engine.running


CALL2 = '{"name": "get_time", "arguments": {"zone": "CET"}}'


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_calls_when_asked_for(stream) -> None:
    script = f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL2}\n</tool_call>\n"
    engine = FakeEngine(step_s=0, script=script, context=8192)
    c = ServerContext.build(engine, ServerArgs())
    plan = plan_tools(TOOLS, "required", get_format("hermes"), parallel=True)
    prompt = render_prompt(c.chat_template, [{"role": "user", "content": "hi"}], plan)

    async def go() -> list[Any]:
        return [e async for e in run_turn(c, prompt, {"max_new_tokens": 300}, plan, None, stream)]
    events = asyncio.run(go())
    end = events[-1]
    assert end.reason == "tool_calls" and [x.name for x in end.calls] == ["get_weather", "get_time"]
    assert [(e.index, e.name) for e in events if isinstance(e, CallStart)] == [
        (0, "get_weather"), (1, "get_time")]
    for i, call in enumerate(end.calls):
        assert "".join(e.text for e in events if isinstance(e, ArgsDelta) and e.index == i) \
            == call.arguments
    single = plan_tools(TOOLS, "required", get_format("hermes"))  # not asked for: one call
    assert single.parallel is False

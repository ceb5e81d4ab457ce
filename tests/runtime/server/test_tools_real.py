"""Tool calling through the official openai and anthropic clients against the real server
(embedded SmolLM2, whose template has no tool support: the documented fallback prompt with
Hermes-style calls). Forced calls are grammar-constrained, so their arguments validate."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from .conftest import API_KEY, Served

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
        "required": ["zone"], "additionalProperties": False}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                                  "description": "Current weather in a city"}},
                {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def oai(real_server: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_server.url + "/v1", api_key=API_KEY, max_retries=0)


def _create(oai, real_server, **kw):
    return oai.chat.completions.create(model=real_server.model, max_tokens=48, temperature=0,
                                      tools=OPENAI_TOOLS, **kw)


@pytest.mark.parametrize("choice,names", [
    ("required", {"get_weather", "get_time"}),
    ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})])
def test_openai_forced_calls_validate_and_stream_the_same(oai, real_server, choice, names):
    out = _create(oai, real_server, messages=ASK, tool_choice=choice)
    choice0 = out.choices[0]
    assert choice0.finish_reason == "tool_calls" and not choice0.message.content
    (call,) = choice0.message.tool_calls
    assert call.type == "function" and call.function.name in names and call.id
    schema = WEATHER if call.function.name == "get_weather" else TIME
    jsonschema.validate(json.loads(call.function.arguments), schema)
    # Streamed: the name first, then argument pieces that join to the same arguments.
    chunks = list(_create(oai, real_server, messages=ASK, tool_choice=choice, stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == call.function.name and deltas[0].id
    assert all(d.index == 0 for d in deltas) and len(deltas) > 2
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_auto_and_none(oai, real_server):
    for stream in (False, True):
        out = _create(oai, real_server, messages=ASK, tool_choice="auto", stream=stream)
        if stream:
            chunks = list(out)
            reason = chunks[-1].choices[0].finish_reason
            calls = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
        else:
            reason, calls = out.choices[0].finish_reason, out.choices[0].message.tool_calls or []
        assert reason in ("stop", "length", "tool_calls")
        assert (reason == "tool_calls") == bool(calls)
    out = _create(oai, real_server, messages=ASK, tool_choice="none")
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].finish_reason in ("stop", "length")


def test_openai_multi_turn_with_tool_results(oai, real_server):
    first = _create(oai, real_server, messages=ASK, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 18}'}]
    out = oai.chat.completions.create(model=real_server.model, max_tokens=16, temperature=0,
                                      tools=OPENAI_TOOLS, tool_choice="none", messages=history)
    assert out.choices[0].finish_reason in ("stop", "length") and out.choices[0].message.content
    bad = history[:-2] + [{"role": "assistant", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "get_time", "arguments": "[1"}}]}]
    with pytest.raises(openai.BadRequestError, match="not a JSON object"):
        oai.chat.completions.create(model=real_server.model, max_tokens=4, messages=bad)
    with pytest.raises(openai.BadRequestError, match="unknown tool"):
        _create(oai, real_server, messages=ASK,
                tool_choice={"type": "function", "function": {"name": "nope"}})
    bad_tool = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "no-such-type"}}}}}]
    for stream in (False, True):  # the grammar's failure is a 400, also for a stream
        with pytest.raises(openai.BadRequestError):
            oai.chat.completions.create(model=real_server.model, max_tokens=8, messages=ASK,
                                        tools=bad_tool, tool_choice="required", stream=stream)


ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Current weather",
                    "input_schema": WEATHER}, {"name": "get_time", "input_schema": TIME}]


def test_anthropic_tools(real_server: Served) -> None:
    client = anthropic.Anthropic(base_url=real_server.url, api_key=API_KEY, max_retries=0)
    kw = dict(model=real_server.model, max_tokens=48, tools=ANTHROPIC_TOOLS, messages=ASK,
              extra_body={"temperature": 0})
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        msg = client.messages.create(tool_choice=choice, **kw)
        (block,) = [b for b in msg.content if b.type == "tool_use"]
        assert msg.stop_reason == "tool_use" and block.id.startswith("toolu_")
        jsonschema.validate(block.input, WEATHER if block.name == "get_weather" else TIME)
        with client.messages.stream(tool_choice=choice, **kw) as stream:
            events = list(stream)
            final = stream.get_final_message()
        partial = "".join(e.delta.partial_json for e in events
                          if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        assert json.loads(partial) == block.input
        assert [b.input for b in final.content if b.type == "tool_use"] == [block.input]
        assert final.stop_reason == "tool_use"
    auto = client.messages.create(tool_choice={"type": "auto"}, **kw)
    assert auto.stop_reason in ("end_turn", "max_tokens", "tool_use")
    history = ASK + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                      "content": "18 degrees"}]}]
    done = client.messages.create(**(kw | {"messages": history, "max_tokens": 16}),
                                  tool_choice={"type": "none"})
    assert done.content[0].type == "text" and done.stop_reason in ("end_turn", "max_tokens")


def test_openai_parallel_calls_validate_and_stream_the_same(oai, real_server):
    kw = dict(messages=ASK, tool_choice="required", parallel_tool_calls=True)
    out = _create(oai, real_server, **kw)
    calls = out.choices[0].message.tool_calls
    assert calls and out.choices[0].finish_reason in ("tool_calls", "length")
    for call in calls if out.choices[0].finish_reason == "tool_calls" else calls[:-1]:
        jsonschema.validate(json.loads(call.function.arguments),
                            WEATHER if call.function.name == "get_weather" else TIME)
    deltas = [d for c in _create(oai, real_server, stream=True, **kw)
              for d in (c.choices[0].delta.tool_calls or [])]
    for i, call in enumerate(calls):
        mine = [d for d in deltas if d.index == i]
        assert mine[0].function.name == call.function.name
        assert "".join(d.function.arguments or "" for d in mine) == call.function.arguments

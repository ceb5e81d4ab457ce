"""``gen(tools=...)`` on every backend with the embedded model: OpenAI and Anthropic as native
tool calls through our server, Local and RuntimeEndpoint as the runtime's constrained calls.
A forced call's arguments validate against the tool's schema; a tool loop runs the function."""
from __future__ import annotations

from typing import Any

import jsonschema
import pytest

import sgdsl as sgl
from sgdsl.tools import tool_spec


def get_weather(city: str, days: int = 1) -> str:
    """Weather forecast for a city."""
    return f"sunny in {city} for {days} day(s)"


def get_time(zone: str) -> str:
    """Current time in a time zone."""
    return "12:00"


TOOLS = [get_weather, get_time]


@sgl.function
def agent(s, choice):
    s += sgl.user("What is the weather in Paris?")
    s += sgl.assistant(sgl.gen("step", max_tokens=32, temperature=0, tools=TOOLS,
                               tool_choice=choice))
    calls = s.tool_calls("step")
    if calls:
        s += sgl.user(sgl.tool_results(calls, TOOLS))
        s += sgl.assistant(sgl.gen("answer", max_tokens=4, temperature=0))


@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_forced_calls_validate_on_every_backend(backend: Any, choice: str) -> None:
    state = agent.run(choice, backend=backend)
    (call,) = state.tool_calls("step")
    assert call.name in (("get_weather", "get_time") if choice == "required" else ("get_time",))
    spec = tool_spec(get_weather if call.name == "get_weather" else get_time)
    jsonschema.validate(call.arguments, spec.parameters)
    assert "<tool_response>" in state.text() and isinstance(state["answer"], str)


def test_auto_and_schema_dict_tools(runtime_backend: Any) -> None:
    schema_tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 10}},
        "required": ["q"], "additionalProperties": False}}}

    @sgl.function
    def prog(s):
        s += sgl.user("Look up 'sgl'.")
        s += sgl.assistant(sgl.gen("x", max_tokens=24, temperature=0, tools=[schema_tool]))

    state = prog.run(backend=runtime_backend)
    for call in state.tool_calls("x"):  # auto: the model may answer in text instead
        assert call.name == "lookup" and set(call.arguments) == {"q"}

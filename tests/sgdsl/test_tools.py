"""Tools in the language: specs from functions and schema dicts, choices, the interpreter's
handling of calls (state.tool_calls, the transcript), the tool loop helpers, and a clear
error on a backend that cannot call tools."""
from __future__ import annotations

import json

import pytest

import sgdsl as sgl
from sgdsl.backends.base import Capabilities, GenResult
from sgdsl.errors import UnsupportedError
from sgdsl.testing import ScriptedBackend
from sgdsl.tools import ToolCall, run_tools, tool_set, tool_spec


def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


def test_specs_and_choices():
    spec = tool_spec(add)
    assert spec.name == "add" and spec.description == "Add two integers."
    assert spec.parameters == {"type": "object", "additionalProperties": False, "required": ["a"],
                               "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    dict_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert tool_spec(dict_tool).name == "f"
    assert tool_spec({"name": "g", "input_schema": {"type": "object"}}).parameters == {
        "type": "object"}
    assert tool_set([add], "add").forced == "add" and tool_set([add]).choice == "auto"
    assert tool_set([add], {"type": "function", "function": {"name": "add"}}).forced == "add"
    with pytest.raises(ValueError, match="unknown tool"):
        tool_set([add], "sub")
    with pytest.raises(ValueError, match="unique"):
        tool_set([add, add])
    with pytest.raises(ValueError, match="tools or one constraint"):
        sgl.gen("x", tools=[add], regex="a")


class ToolBackend(ScriptedBackend):
    async def generate(self, ctx, params, constraint=None):
        self.seen = constraint
        meta = {"prompt_tokens": 1, "completion_tokens": 2, "finish_reason": {"type": "stop"},
                "tool_calls": [{"id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}]}
        return [GenResult("Adding.", meta)]


@sgl.function
def loop(s):
    s += sgl.user("2+3?")
    s += sgl.assistant(sgl.gen("step", tools=[add], tool_choice="required"))
    s += sgl.user(sgl.tool_results(s.tool_calls("step"), [add]))


def test_calls_land_in_the_state_and_the_transcript():
    backend = ToolBackend(capabilities=Capabilities(constraints=frozenset({"tools"})))
    state = loop.run(backend=backend)
    assert backend.seen.kind == "tools" and backend.seen.value.choice == "required"
    assert state.tool_calls("step") == [ToolCall("add", {"a": 2, "b": 3}, "c1")]
    assert state["step"] == "Adding."
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' \
        in state.text()
    assert json.loads(state.text().split("<tool_response>\n")[1].split("\n</tool_response>")[0]) \
        == {"name": "add", "result": 5}


def test_a_backend_without_tools_refuses_before_generating():
    backend = ScriptedBackend(outputs=["x"])
    with pytest.raises(UnsupportedError, match="cannot call tools"):
        loop.run(backend=backend)
    assert backend.calls == []


def test_run_tools_reports_failures_as_results():
    assert run_tools([ToolCall("add", {"a": 1})], [add]) == [1]
    assert run_tools([ToolCall("add", {"zz": 1})], [add])[0].startswith("error: TypeError")
    with pytest.raises(ValueError, match="no Python function"):
        run_tools([ToolCall("nope", {})], [add])

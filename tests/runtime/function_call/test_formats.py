"""Tool-call parsers on outputs written the way each family writes them, including malformed
and partial ones: a call is reported only when it is well formed, and every character that is
not part of a reported call stays in the normal text."""
from __future__ import annotations

import json

import pytest

from sgdsl.runtime.function_call import ToolCall, detect_format, get_format

W = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'


def _args(call: ToolCall) -> dict:
    return json.loads(call.arguments)


# ---------------------------------------------------------------- Hermes / Qwen

def test_hermes_calls_and_text_around_them() -> None:
    text = (f"I'll check both.\n<tool_call>\n{W}\n</tool_call>\n<tool_call>\n"
            '{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
    r = get_format("qwen25").parse(text)
    assert [c.name for c in r.calls] == ["get_weather", "get_time"]
    assert _args(r.calls[0]) == {"city": "Paris", "unit": "celsius"}
    assert r.normal_text == "I'll check both.\n\n"


@pytest.mark.parametrize("text", [
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",  # cut short
    "<tool_call>\n{\"arguments\": {}}\n</tool_call>",  # no name
    "<tool_call>\nnot json at all\n</tool_call> and more",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",  # arguments not an object
    "Use <tool_call> tags to call tools.",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} trailing\n</tool_call>",
])
def test_hermes_malformed_blocks_stay_text(text) -> None:
    r = get_format("hermes").parse(text)
    assert r.calls == () and r.normal_text == text


def test_hermes_unclosed_but_complete_call_and_string_arguments() -> None:
    r = get_format("qwen3").parse(f"<tool_call>\n{W}\n")
    assert [c.name for c in r.calls] == ["get_weather"] and r.normal_text == ""
    quoted = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    assert _args(get_format("hermes").parse(quoted).calls[0]) == {"x": 1}


# ---------------------------------------------------------------- Llama 3.x

def test_llama3_json_and_python_tag() -> None:
    fmt = get_format("llama3")
    r = fmt.parse('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert r.calls == (ToolCall("get_weather", '{"city": "Paris"}'),) and r.normal_text == ""
    r = fmt.parse('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": '
                  '{"x": 2}}')
    assert [c.name for c in r.calls] == ["a", "b"] and _args(r.calls[1]) == {"x": 2}


@pytest.mark.parametrize("text", [
    "The weather in Paris is mild.",
    '{"name": "get_weather", "parameters": {"city": "Par',  # cut short
    '{"city": "Paris"}',  # JSON, but no call
    'Here you go: {"name": "f", "parameters": {}}',  # a call inside prose is prose
    '{"name": "f", "parameters": {}} and then some words',
])
def test_llama3_non_calls_stay_text(text) -> None:
    r = get_format("llama3").parse(text)
    assert r.calls == () and r.normal_text == text


# ---------------------------------------------------------------- Mistral

def test_mistral_array_and_args_forms() -> None:
    fmt = get_format("mistral")
    r = fmt.parse(f'Sure. [TOOL_CALLS] [{W}, {{"name": "t", "arguments": {{}}}}]')
    assert [c.name for c in r.calls] == ["get_weather", "t"] and r.normal_text == "Sure. "
    r = fmt.parse('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]t[ARGS]{}')
    assert [c.name for c in r.calls] == ["get_weather", "t"] and _args(r.calls[0]) == {
        "city": "Rome"}


@pytest.mark.parametrize("text", [
    "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"ci",
    "[TOOL_CALLS] [{\"arguments\": {}}]",
    "[TOOL_CALLS]get_weather[ARGS]{\"city\":",
    "No calls here.",
])
def test_mistral_malformed_stays_text(text) -> None:
    r = get_format("mistral").parse(text)
    assert r.calls == () and r.normal_text == text


# ---------------------------------------------------------------- choice of format

def test_detection_from_template_and_names() -> None:
    assert detect_format("{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert detect_format("{% if tools %}<|python_tag|>ipython{% endif %}").name == "llama3"
    assert detect_format("{{ '[AVAILABLE_TOOLS]' }}{% if tools %}{% endif %}").name == "mistral"
    assert detect_format(None).name == "hermes"
    with pytest.raises(ValueError, match="known"):
        get_format("nope")


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral"])
def test_rendered_calls_parse_back(name) -> None:
    fmt = get_format(name)
    calls = (ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("t", "{}"))
    r = fmt.parse(fmt.render_calls(calls))
    assert [(c.name, _args(c)) for c in r.calls] == [("get_weather", {"city": "Paris"}),
                                                    ("t", {})]

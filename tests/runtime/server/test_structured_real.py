"""Structured output through the protocols: OpenAI response_format and Anthropic forced tools
become the engine's json_schema constraint."""
from __future__ import annotations

import json

import anthropic
import openai

from .conftest import API_KEY, Served

SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}},
          "required": ["age"], "additionalProperties": False}


def test_openai_response_format_json_schema(real_server: Served) -> None:
    client = openai.OpenAI(base_url=real_server.url + "/v1", api_key=API_KEY, max_retries=0)
    out = client.chat.completions.create(
        model=real_server.model, max_tokens=24, temperature=0,
        messages=[{"role": "user", "content": "How old is Bob? He is 42."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"age"} and isinstance(value["age"], int)


def test_anthropic_forced_tool(real_server: Served) -> None:
    client = anthropic.Anthropic(base_url=real_server.url, api_key=API_KEY, max_retries=0)
    msg = client.messages.create(
        model=real_server.model, max_tokens=24, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Bob is 42. Record his age."}],
        tools=[{"name": "record", "description": "store an age", "input_schema": SCHEMA}],
        tool_choice={"type": "tool", "name": "record"})
    block = msg.content[0]
    assert block.type == "tool_use" and block.name == "record"
    assert set(block.input) == {"age"} and isinstance(block.input["age"], int)
    assert msg.stop_reason == "tool_use"

"""A reasoning parser on the server with the real embedded model: a grammar (response_format,
forced tools) applies to the answer after the reasoning section. SmolLM2 never opens
``<think>``, so with ``qwen3`` the answer is generated after an empty section, under the
grammar: the content must parse and validate."""
from __future__ import annotations

import json
from typing import Any, Iterator

import jsonschema
import openai
import pytest

from sgdsl.runtime.server.thread_server import ThreadServer

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"], "additionalProperties": False}


@pytest.fixture(scope="module")
def reasoning_url(engine: Any) -> Iterator[str]:
    from sgdsl.runtime.server.app import create_app
    from sgdsl.runtime.server.args import ServerArgs

    server = ThreadServer(create_app(engine, ServerArgs(reasoning_parser="qwen3")))
    yield server.start()
    server.stop()


def test_grammar_applies_after_the_reasoning(reasoning_url: str, model_name: str) -> None:
    client = openai.OpenAI(base_url=reasoning_url + "/v1", api_key="x", max_retries=0)
    kw = dict(model=model_name, max_tokens=24, temperature=0,
              messages=[{"role": "user", "content": "Which city is the capital of France?"}],
              response_format={"type": "json_schema", "json_schema": {"name": "c",
                                                                      "schema": SCHEMA}})
    msg = client.chat.completions.create(**kw).choices[0].message
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    assert msg.model_extra.get("reasoning_content") is None
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content

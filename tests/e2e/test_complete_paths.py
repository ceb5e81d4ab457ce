"""Forced completion on every path (issue 15, items 3 and 6): with budgets just above the
shortest completion, where the model alone runs out, every constrained output is a complete,
valid value that finishes with "stop": Engine, ``/generate``, OpenAI ``response_format``,
Anthropic forced tools, and the language's ``gen(json_schema=...)``, ``regex`` and ``dtype``
on Local and RuntimeEndpoint, plus SGLang's own ``decode_json`` test program (as SGLang's
python/sglang/test/test_programs.py writes it) with max_new_tokens=64."""
from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

import sgdsl as sgl

pytestmark = pytest.mark.slow  # the shared engine with the embedded model

# Three required fields; the model is asked for long text, so it would need far more tokens.
SCHEMA = {"type": "object", "required": ["name", "bio", "age"], "additionalProperties": False,
          "properties": {"name": {"type": "string"}, "bio": {"type": "string"},
                         "age": {"type": "integer"}}}
ASK = "Invent a person with a very long name and a detailed biography of ten sentences."
BUDGET = 24  # the shortest completion takes 16 tokens with the stop token


@sgl.function
def decode_json(s):
    s += "Generate a JSON object to describe the basic city information of Paris.\n"

    with s.var_scope("json_output"):
        s += "{\n"
        s += '  "name": ' + sgl.gen_string() + ",\n"
        s += '  "population": ' + sgl.gen_int() + ",\n"
        s += '  "area": ' + sgl.gen(dtype=int) + ",\n"
        s += '  "country": ' + sgl.gen_string() + ",\n"
        s += '  "timezone": ' + sgl.gen(dtype=str) + "\n"
        s += "}"


@sgl.function
def tight_person(s):
    s += sgl.user(ASK + " Reply in JSON.")
    s += sgl.assistant(sgl.gen("person", json_schema=SCHEMA, max_tokens=BUDGET,
                               temperature=0.8))


@sgl.function
def tight_regex_and_int(s):
    s += sgl.user("Write a long sentence, then a big number.")
    s += sgl.assistant(sgl.gen("words", regex=r"[a-z]+( [a-z]+)*\.", max_tokens=4,
                               temperature=0.8)
                       + " " + sgl.gen_int("n", max_tokens=3, temperature=0.8))


def _check(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


def test_decode_json_program(runtime_backend):
    ret = decode_json.run(max_new_tokens=64, backend=runtime_backend)
    js_obj = json.loads(ret["json_output"])
    assert isinstance(js_obj["name"], str)
    assert isinstance(js_obj["population"], int)


def test_language_json_schema_regex_dtype(runtime_backend):
    state = tight_person.run(backend=runtime_backend)
    _check(state["person"])
    assert state.get_meta_info("person")["finish_reason"]["type"] == "stop"
    state = tight_regex_and_int.run(backend=runtime_backend)
    assert state["words"].endswith(".") and isinstance(int(state["n"]), int)
    for var in ("words", "n"):
        assert state.get_meta_info(var)["finish_reason"]["type"] == "stop"


def test_engine_and_generate(engine, server_url):
    prompt = f"<|im_start|>user\n{ASK}<|im_end|>\n<|im_start|>assistant\n"
    params = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": BUDGET,
              "temperature": 0.8, "seed": 5}
    out = engine.generate(prompt, params)
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    _check(out["text"])
    r = httpx.post(server_url + "/generate", json={"text": prompt, "sampling_params": params},
                   timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["finish_reason"]["type"] == "stop"
    _check(r.json()["text"])
    engine.check_idle_integrity()


def test_openai_response_format(server_url, model_name):
    client = openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model=model_name, max_tokens=BUDGET, temperature=0.8, seed=5,
        messages=[{"role": "user", "content": ASK}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    assert out.choices[0].finish_reason == "stop"
    _check(out.choices[0].message.content)


def test_anthropic_forced_tool(server_url, model_name):
    client = anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0)
    msg = client.messages.create(
        model=model_name, max_tokens=BUDGET, extra_body={"temperature": 0.8},
        messages=[{"role": "user", "content": ASK}],
        tools=[{"name": "record", "description": "store a person", "input_schema": SCHEMA}],
        tool_choice={"type": "tool", "name": "record"})
    assert msg.stop_reason == "tool_use"
    block = msg.content[0]
    assert block.type == "tool_use" and block.name == "record"
    jsonschema.validate(block.input, SCHEMA)

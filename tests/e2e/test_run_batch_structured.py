"""``run_batch`` of a ``gen(json_schema=...)`` program on both runtime backends (issue 29): the
programs' requests reach the runtime together (Local: one Engine call; RuntimeEndpoint: one
list ``/generate``), every output validates, and a program whose request the runtime refuses
fails alone (the batch is retried one by one)."""
from __future__ import annotations

import json

import jsonschema
import pytest

import sgdsl as sgl

pytestmark = pytest.mark.slow  # the shared engine with the embedded model

SCHEMA = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 16},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
NAMES = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald"]


@sgl.function
def person(s, name: str, top_p: float):
    s += f"Describe {name} as a JSON object with a name and an age.\n"
    s += sgl.gen("out", max_tokens=40, json_schema=SCHEMA, temperature=0.0, top_p=top_p)


def test_run_batch_json_schema(runtime_backend):
    states = person.run_batch([{"name": n, "top_p": 1.0} for n in NAMES],
                              backend=runtime_backend)
    for state in states:
        assert state.error() is None
        jsonschema.validate(json.loads(state["out"]), SCHEMA)


def test_run_batch_refused_program_fails_alone(runtime_backend):
    inputs = [{"name": n, "top_p": 1.0} for n in NAMES[:3]]
    inputs.insert(1, {"name": "Nobody", "top_p": 0.0})  # top_p must be in (0, 1]: a 400
    states = person.run_batch(inputs, backend=runtime_backend)
    error = states[1].error()
    assert isinstance(error, sgl.BackendError) and error.status == 400
    for state in states[:1] + states[2:]:
        assert state.error() is None
        jsonschema.validate(json.loads(state["out"]), SCHEMA)


def test_run_batch_parses_the_runtimes_checked_outputs_without_validating_again(
        runtime_backend, monkeypatch):
    """The runtime validates every json_schema output its grammar ended against the original
    schema (its backstop), so the interpreter only parses those; the others (cut by length)
    it still validates itself."""
    from sgdsl.interpreter import lowering

    validated: list[str] = []
    real = lowering.check_json

    def counting(text, schema, model=None):
        validated.append(text)
        return real(text, schema, model)
    monkeypatch.setattr(lowering, "check_json", counting)
    states = person.run_batch([{"name": n, "top_p": 1.0} for n in NAMES],
                              backend=runtime_backend)
    cut = []
    for state in states:
        assert state.error() is None
        meta = state.get_meta_info("out")
        assert state.get_parsed("out") == json.loads(state["out"])
        reason = meta["finish_reason"]
        if reason["type"] != "stop" or isinstance(reason.get("matched"), str):
            cut.append(state["out"])
        else:
            jsonschema.validate(state.get_parsed("out"), SCHEMA)
    assert sorted(validated) == sorted(cut)
    assert len(cut) < len(NAMES)  # most outputs end by the grammar here

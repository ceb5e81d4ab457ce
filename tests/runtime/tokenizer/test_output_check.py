"""The backstop in the main process: a json_schema output the grammar ended is validated against
the original schema; a violation is an error with the reason, never a silent success."""
from __future__ import annotations

import asyncio
import json

import pytest

from sgdsl.runtime.errors import ConstraintViolationError
from sgdsl.runtime.grammar.schema import OutputValidator
from sgdsl.runtime.ipc.messages import ReqOut
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.tokenizer.req_state import ReqState

EOS = 0
SCHEMA = {"type": "object", "properties": {"pojo": {"type": "string"},
                                           "json": {"type": "string"}},
          "additionalProperties": False, "oneOf": [{"required": ["pojo"]}, {"required": ["json"]}]}


class CharTokenizer:
    """Token i is chr(i) (0 is the stop token and decodes to nothing)."""

    def decode(self, ids, **_):
        return "".join(chr(i) for i in ids if i != EOS)


def _finish(text: str, reason: dict, **params) -> ReqState:
    async def go():
        sp = SamplingParams.from_dict({"json_schema": json.dumps(SCHEMA), **params})
        state = ReqState("r1", sp, CharTokenizer(), validator=OutputValidator())
        state.apply(ReqOut("r1", [ord(c) for c in text] + [EOS], finish_reason=reason))
        return state
    return asyncio.run(go())


def test_valid_output_is_a_success():
    state = _finish('{"pojo": "a"}', {"type": "stop", "matched": EOS})
    assert state.error is None and state.final_text() == '{"pojo": "a"}'


@pytest.mark.parametrize("text,reason", [
    ('{"pojo": "a", "json": "b"}', "oneOf"),  # both branches: oneOf forbids it
    ('{"pojo": 1', "not valid JSON"),
])
def test_violation_is_an_error_naming_the_reason(text, reason):
    state = _finish(text, {"type": "stop", "matched": EOS})
    assert isinstance(state.error, ConstraintViolationError) and state.done.is_set()
    assert reason in str(state.error) and state.error.status == 500


def test_cut_or_user_stopped_output_keeps_its_finish_reason():
    for reason in ({"type": "length", "length": 3}, {"type": "stop", "matched": "}"},
                   {"type": "abort", "message": "x"}):
        state = _finish('{"pojo', reason)
        assert state.error is None and state.finish_reason == reason


def test_unconstrained_and_any_json_requests():
    async def go():
        plain = ReqState("r", SamplingParams.from_dict({}), CharTokenizer(),
                         validator=OutputValidator())
        plain.apply(ReqOut("r", [ord("x"), EOS], finish_reason={"type": "stop", "matched": EOS}))
        anyjson = ReqState("a", SamplingParams.from_dict({"json_schema": "$$ANY$$"}),
                           CharTokenizer(), validator=OutputValidator())
        anyjson.apply(ReqOut("a", [ord("["), EOS], finish_reason={"type": "stop", "matched": EOS}))
        return plain, anyjson
    plain, anyjson = asyncio.run(go())
    assert plain.error is None
    assert isinstance(anyjson.error, ConstraintViolationError)


def test_backtracking_schema_pattern_fails_the_check_within_the_time_bound():
    """A branch the output did not take is still searched: with ``re`` this pattern needs
    seconds on 40 characters; the check gives up at the time bound and fails, never passes."""
    schema = {"oneOf": [{"type": "string", "pattern": "^(a|aa)+$"},
                        {"type": "string", "pattern": "^a+b$"}]}
    validator = OutputValidator()
    why = validator.violation(json.dumps(schema), json.dumps("a" * 40 + "b"))
    assert why is not None and "could not be checked" in why and "(a|aa)+$" in why
    assert validator.violation(json.dumps(schema), json.dumps("aab")) is None


@pytest.mark.parametrize("instance,ok", [
    ({"x-1": 1, "name": "a"}, True), ({"x-1": "no"}, False), ({"other": 1}, False)])
def test_pattern_properties_and_additional_properties(instance, ok):
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "patternProperties": {"^x-\\d+$": {"type": "integer"}},
              "additionalProperties": False}
    why = OutputValidator().violation(json.dumps(schema), json.dumps(instance))
    assert (why is None) == ok, why

"""Constraint lowering decisions: native, rewritten to regex, validate-and-retry, or an error
before the first token."""
from __future__ import annotations

import json

import pydantic
import pytest

import sgdsl as sgl
from sgdsl.backends.base import Capabilities
from sgdsl.errors import ConstraintViolationError, UnsupportedError
from sgdsl.testing import ScriptedBackend


def _prog(node):
    @sgl.function
    def prog(s):
        s += "Q: "
        s += node
    return prog


def test_native_constraint_goes_to_the_backend():
    backend = ScriptedBackend(outputs=["abc"], capabilities=Capabilities(constraints=frozenset({"regex"})))
    state = _prog(sgl.gen("x", regex="[a-z]+")).run(backend=backend)
    assert state["x"] == "abc"
    assert backend.calls[0].constraint.kind == "regex" and backend.calls[0].constraint.value == "[a-z]+"


def test_dtype_is_rewritten_to_regex_when_the_backend_has_regex():
    backend = ScriptedBackend(outputs=["17"], capabilities=Capabilities(constraints=frozenset({"regex"})))
    state = _prog(sgl.gen_int("n")).run(backend=backend)
    assert backend.calls[0].constraint.kind == "regex"
    assert state["n"] == "17" and state.get_parsed("n") == 17


def test_regex_without_native_support_is_validated_and_retried():
    backend = ScriptedBackend(outputs=["nope!", "  42  "])
    state = _prog(sgl.gen("x", regex=r"\d+", temperature=0)).run(backend=backend)
    assert state["x"] == "42"
    assert len(backend.calls) == 2 and backend.calls[0].constraint is None
    assert backend.calls[1].params.temperature > 0  # a greedy retry would repeat itself
    assert state.get_meta_info("x")["attempts"] == 2


def test_retries_are_bounded_and_fail_with_a_typed_error():
    backend = ScriptedBackend(outputs=["a", "b", "c", "d"])
    with pytest.raises(ConstraintViolationError) as info:
        _prog(sgl.gen("x", regex=r"\d+")).run(backend=backend)
    assert info.value.attempts == 3 and info.value.last_output == "c"
    assert len(backend.calls) == 3


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_json_schema_from_pydantic_is_parsed_into_the_model():
    good = json.dumps({"name": "Ada", "age": 36})
    backend = ScriptedBackend(outputs=["{broken", f"```json\n{good}\n```"])
    state = _prog(sgl.gen("p", json_schema=Person)).run(backend=backend)
    assert state["p"] == good
    assert state.get_parsed("p") == Person(name="Ada", age=36)


def test_json_schema_dict_is_validated():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    backend = ScriptedBackend(outputs=['{"n": "x"}', '{"m": 1}', '{"n": 3}'])
    state = _prog(sgl.gen("j", json_schema=schema)).run(backend=backend)
    assert state.get_parsed("j") == {"n": 3} and len(backend.calls) == 3


def test_native_json_schema_passes_the_schema_string():
    backend = ScriptedBackend(outputs=['{"name": "B", "age": 2}'],
                              capabilities=Capabilities(constraints=frozenset({"json_schema"})))
    state = _prog(sgl.gen("p", json_schema=Person)).run(backend=backend)
    constraint = backend.calls[0].constraint
    assert constraint.kind == "json_schema" and json.loads(constraint.value)["required"] == ["name", "age"]
    assert state.get_parsed("p").age == 2


def test_ebnf_without_native_support_fails_before_the_first_token():
    backend = ScriptedBackend(outputs=["x"])
    with pytest.raises(UnsupportedError, match="EBNF"):
        _prog(sgl.gen("x", ebnf='root ::= "a"')).run(backend=backend)
    assert backend.calls == []


def test_select_by_logprobs_uses_the_choice_method():
    backend = ScriptedBackend(choice_logprobs={"red": [-2.0], "blue sky": [-0.1, -5.0]})
    state = _prog(sgl.select("c", ["red", "blue sky"])).run(backend=backend)
    assert state["c"] == "red"  # mean -2.0 > -2.55
    state = _prog(sgl.select("c", ["red", "blue sky"], choices_method=sgl.greedy_token_selection)).run(
        backend=ScriptedBackend(choice_logprobs={"red": [-2.0], "blue sky": [-0.1, -5.0]}))
    assert state["c"] == "blue sky"
    assert state.text() == "Q: blue sky"


def test_select_without_logprobs_uses_a_native_choices_constraint():
    backend = ScriptedBackend(outputs=["no"], capabilities=Capabilities(constraints=frozenset({"choices"})))
    state = _prog(sgl.gen("c", choices=["yes", "no"])).run(backend=backend)
    assert state["c"] == "no"
    assert backend.calls[0].constraint.value == ("yes", "no")


def test_select_without_logprobs_or_constraints_validates_generation():
    backend = ScriptedBackend(outputs=["maybe", " yes\n"], capabilities=Capabilities())
    state = _prog(sgl.select("c", ["yes", "no"])).run(backend=backend)
    assert state["c"] == "yes" and len(backend.calls) == 2


def test_images_on_a_text_only_backend_are_a_clear_error():
    with pytest.raises(UnsupportedError, match="images"):
        _prog(sgl.image(b"\x89PNG....")).run(backend=ScriptedBackend())


def test_images_are_attached_to_the_turn():
    backend = ScriptedBackend(outputs=["a cat"], capabilities=Capabilities(images=True, max_images=2))

    @sgl.function
    def prog(s):
        s += sgl.user(sgl.image(b"\x89PNG1") + "what?" + sgl.image(b"\xff\xd8jpg"))
        s += sgl.assistant(sgl.gen("d"))

    state = prog.run(backend=backend)
    ctx = backend.calls[0].context
    assert [i.mime_type for i in ctx.messages[0].images] == ["image/png", "image/jpeg"]
    parts = state.messages()[0]["content"]
    assert parts[0]["type"] == "text" and parts[1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_partial_assistant_turn_on_a_chat_backend_without_prefill_is_rejected():
    backend = ScriptedBackend(outputs=["x"], capabilities=Capabilities(chat_only=True))

    @sgl.function
    def prog(s):
        s += sgl.user("hi")
        s += sgl.assistant("Sure, " + sgl.gen("rest"))

    with pytest.raises(UnsupportedError, match="partly written assistant turn"):
        prog.run(backend=backend)
    assert backend.calls == []


def test_stop_regex_is_emulated_when_the_backend_lacks_it():
    backend = ScriptedBackend(outputs=["one 22 three"], capabilities=Capabilities())
    state = _prog(sgl.gen("x", stop_regex=r"\d+")).run(backend=backend)
    assert state["x"] == "one "


def test_emulated_stop_regex_cancels_the_stream_at_the_match():
    """OpenAI/Anthropic have no stop_regex: the interpreter streams and stops reading (which
    closes the backend's stream, aborting its request) once a pattern matches."""
    class Counting(ScriptedBackend):
        read = 0
        closed = False

        async def stream(self, *args, **kwargs):
            try:
                async for chunk in super().stream(*args, **kwargs):
                    type(self).read += 1
                    yield chunk
            finally:
                type(self).closed = True

    backend = Counting(outputs=["a b c END7 d e f g h"], capabilities=Capabilities())
    state = _prog(sgl.gen("x", stop_regex=[r"END\d", r"zzz"])).run(backend=backend)
    assert state["x"] == "a b c "
    assert state.get_meta_info("x")["finish_reason"] == {"type": "stop", "matched": r"END\d"}
    assert Counting.read == 4 and Counting.closed  # "a", " b", " c", " END7": nothing after


def test_api_speculative_execution_reads_ahead():
    backend = ScriptedBackend(outputs=["Ada\nAge: 36\nmore"])

    @sgl.function(num_api_spec_tokens=256)
    def prog(s):
        s += "Name: " + sgl.gen("name", stop="\n") + "\nAge: " + sgl.gen("age", stop="\n")

    state = prog.run(backend=backend)
    assert (state["name"], state["age"]) == ("Ada", "36")
    assert len(backend.calls) == 1 and backend.calls[0].params.max_tokens == 256


def test_check_json_reports_as_jsonschema_and_refuses_a_bad_schema():
    import jsonschema

    from sgdsl.interpreter.validate import check_json

    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}},
              "required": ["n"]}
    for form in (schema, json.dumps(schema)):  # dict or text: one cached validator each
        assert check_json('{"n": 2}', form) == ({"n": 2}, '{"n": 2}')
        with pytest.raises(ValueError, match="5 is greater than the maximum of 3"):
            check_json('{"n": 5}', form)
    with pytest.raises(jsonschema.SchemaError):
        check_json('{"n": 5}', {"type": "nonsense"})


def test_only_the_sgdsl_runtimes_checked_outputs_skip_validation():
    """``schema_checked``: an output the sgdsl runtime's backstop validated (a constrained
    output of it carries ``forced_token_positions``; the grammar ended it on a token) is only
    parsed; an SGLang server's, or one cut by length or a stop string, is validated here."""
    from sgdsl.backends.srt import result_of
    from sgdsl.interpreter.lowering import Checked, plan_constraint
    from sgdsl.ir import Constraint

    def out(reason, **meta):
        return {"text": '{"a": 1}', "meta_info": {"finish_reason": reason, **meta}}
    ended = {"type": "stop", "matched": 2}
    assert result_of(out(ended, forced_token_positions=[]), json_schema=True).schema_checked
    assert not result_of(out(ended, forced_token_positions=[])).schema_checked  # no schema sent
    assert not result_of(out(ended), json_schema=True).schema_checked  # an SGLang server
    for reason in ({"type": "length", "length": 8}, {"type": "stop", "matched": "}"}):
        assert not result_of(out(reason, forced_token_positions=[]), True).schema_checked
    backend = ScriptedBackend(capabilities=Capabilities(constraints=frozenset({"json_schema"})))
    plan = plan_constraint(backend, Constraint("json_schema", '{"type": "integer", "minimum": 5}'))
    assert plan.check_result("3", schema_checked=True) == Checked(True, "3", 3)
    assert not plan.check_result("3").ok  # not vouched for: validated
    assert not plan.check_result("{", schema_checked=True).ok  # still parsed

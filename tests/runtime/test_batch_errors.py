"""Per-request errors in a batch (issue 29, item 4): a request that fails at runtime takes its
place in the results as a dict whose finish_reason carries the error (SGLang's abort shape);
the other requests of the batch return normally. A single request still raises, typed.

Failures made deterministic on the real embedded model: ``OVERLAP`` is a oneOf whose two
branches accept the same (only) value, so the grammar can produce nothing but ``[]`` and the
backstop (the output check) rejects it as matching both branches; an unbalanced regex passes the
request checks and fails to compile in the scheduler process.
"""
from __future__ import annotations

import json

import pytest

from sgdsl.runtime.errors import ConstraintViolationError, InvalidRequestError

OVERLAP = json.dumps({"oneOf": [{"type": "array", "maxItems": 0},
                                {"type": "array", "uniqueItems": True, "maxItems": 0}]})
PERSON = json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                      "age": {"type": "integer"}},
                     "required": ["name", "age"], "additionalProperties": False})


@pytest.fixture
def engine(embedded_engine):
    yield embedded_engine
    embedded_engine.check_idle_integrity()


def _abort(out: dict) -> dict:
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort", reason
    return reason


def test_one_violating_request_does_not_discard_the_batch(engine):
    params = [{"json_schema": PERSON, "max_new_tokens": 32, "temperature": 0},
              {"json_schema": OVERLAP, "max_new_tokens": 8, "temperature": 0},
              {"max_new_tokens": 4, "temperature": 0},
              {"regex": "(ab", "max_new_tokens": 4}]
    outs = engine.generate(["A person:", "An empty list:", "Hello", "x"], params)
    assert len(outs) == 4
    person = json.loads(outs[0]["text"])  # the grammar ended it: valid under PERSON
    assert set(person) == {"name", "age"}
    assert outs[0]["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert outs[2]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    violated = _abort(outs[1])
    assert violated["status_code"] == 500 and violated["err_type"] == "constraint_violation"
    assert "oneOf" in violated["message"] and outs[1]["text"] == "[]"
    bad_regex = _abort(outs[3])
    assert bad_regex["status_code"] == 400 and bad_regex["err_type"] == "invalid_request_error"
    assert "regex" in bad_regex["message"] and outs[3]["output_ids"] == []


def test_async_batch_reports_per_request_errors_too(engine):
    import asyncio

    outs = asyncio.run(engine.async_generate(
        ["[", "Hi"], [{"json_schema": OVERLAP, "max_new_tokens": 8},
                      {"max_new_tokens": 2, "temperature": 0}]))
    assert _abort(outs[0])["err_type"] == "constraint_violation"
    assert outs[1]["meta_info"]["finish_reason"]["type"] == "length"


def test_single_request_still_raises_the_typed_error(engine):
    with pytest.raises(ConstraintViolationError, match="oneOf"):
        engine.generate("An empty list:", {"json_schema": OVERLAP, "max_new_tokens": 8})
    with pytest.raises(InvalidRequestError) as info:
        engine.generate("x", {"regex": "(ab", "max_new_tokens": 4})
    assert info.value.field == "regex"


def test_n_samples_of_one_prompt_report_errors_per_sample(engine):
    outs = engine.generate("An empty list:", {"json_schema": OVERLAP, "max_new_tokens": 8,
                                              "n": 2})
    assert len(outs) == 2 and all(_abort(o)["status_code"] == 500 for o in outs)


def test_local_backend_raises_each_coalesced_requests_own_error(engine, monkeypatch):
    """Local coalesces concurrent gens into one hand-off (single calls of one loop turn, their
    prompts tokenized together): the failed one raises its own (typed, chained) error and the
    others return; n > 1 still raises as one request."""
    import asyncio

    from sgdsl.backends.base import BackendError, Context
    from sgdsl.backends.local import Local
    from sgdsl.ir import Constraint, SamplingParams

    backend = Local(engine=engine)
    overlap = Constraint("json_schema", OVERLAP)
    calls, real = [], engine.async_generate

    def counting(*args, **kw):
        calls.append(kw["input_ids"] if "input_ids" in kw else kw.get("prompt"))
        return real(*args, **kw)
    monkeypatch.setattr(engine, "async_generate", counting)

    async def go():
        return await asyncio.gather(
            backend.generate(Context(text="An empty list:"), SamplingParams(max_tokens=8),
                             overlap),
            backend.generate(Context(text="Hello"), SamplingParams(max_tokens=3,
                                                                   temperature=0.0)),
            return_exceptions=True)
    handoffs = engine.stats()["submit_handoffs"]
    bad, good = asyncio.run(go())
    assert isinstance(bad, BackendError) and bad.status == 500, bad
    assert isinstance(bad.__cause__, ConstraintViolationError)
    assert good[0].text and len(good) == 1
    assert calls == [engine.tokenizer.encode(t, add_special_tokens=False)
                     for t in ("An empty list:", "Hello")]
    assert engine.stats()["submit_handoffs"] - handoffs == 1  # together to the scheduler
    with pytest.raises(BackendError) as info:
        asyncio.run(backend.generate(Context(text="An empty list:"),
                                     SamplingParams(max_tokens=8, n=2), overlap))
    assert isinstance(info.value.__cause__, ConstraintViolationError)

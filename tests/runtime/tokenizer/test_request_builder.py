"""RequestBuilder's constraint checks (issue 29, item 1): a schema shared by a batch is checked
once (the meta-schema validation costs ~20 ms a schema: 256 requests paid it 256 times before
anything reached the scheduler), while every request still gets the same outcome."""
from __future__ import annotations

import json
import re

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.compile.limits import GrammarLimits
from sgdsl.runtime.ipc.messages import Ready
from sgdsl.runtime.tokenizer.request_builder import RequestBuilder

READY = Ready(model_dir="", context_len=4096, vocab_size=49152, kv_total_slots=65536,
              max_running_requests=256, eos_token_ids=(2,))
SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 10 ** 9}}}


@pytest.fixture
def checks(monkeypatch) -> list:
    seen = []
    real = GrammarLimits.check

    def counting(self, key):
        seen.append(key.text)
        return real(self, key)
    monkeypatch.setattr(GrammarLimits, "check", counting)
    return seen


def _build(builder, params, n=1):
    specs, _ = builder.build(None, params, [[5, 6, 7]] * n, False, -1, 0, False, None)
    return [s.reqs[0].sampling_params for s in specs]


def test_a_batch_sharing_a_schema_checks_it_once(tokenizer, checks):
    builder = RequestBuilder(tokenizer, READY)
    sps = _build(builder, {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 8}, n=64)
    assert len(checks) == 1
    # the unreachable bound was dropped, the same way for every request
    assert all(sp.json_schema == sps[0].json_schema for sp in sps)
    assert "maxLength" not in sps[0].json_schema
    _build(builder, {"json_schema": SCHEMA, "max_new_tokens": 8}, n=4)  # a dict: the same text
    assert len(checks) == 1
    _build(builder, {"regex": "a+", "max_new_tokens": 8}, n=4)
    assert len(checks) == 2


def test_a_remembered_rejection_is_raised_every_time(tokenizer, checks):
    builder = RequestBuilder(tokenizer, READY)
    bad = json.dumps({"type": "object", "properties": {"a": {"type": 5}}})
    for _ in range(3):
        with pytest.raises(InvalidRequestError) as info:
            _build(builder, {"json_schema": bad, "max_new_tokens": 8}, n=2)
        assert info.value.field == "json_schema" and "not a valid JSON Schema" in str(info.value)
    assert len(checks) == 1


def test_the_budget_decides_whether_a_bound_is_vacuous(tokenizer):
    from sgdsl.runtime.grammar.compile.vacuous_bounds import longest_token_bytes

    builder = RequestBuilder(tokenizer, READY)
    bound = GrammarLimits().max_schema_bound + 1  # over the limit: allowed only when vacuous
    schema = json.dumps({"type": "string", "maxLength": bound})
    sp = _build(builder, {"json_schema": schema, "max_new_tokens": 8})[0]
    assert "maxLength" not in sp.json_schema
    reach = bound // longest_token_bytes(tokenizer) + 1  # this budget could reach the bound
    with pytest.raises(InvalidRequestError, match="maxLength"):
        _build(builder, {"json_schema": schema, "max_new_tokens": reach})
    assert "maxLength" not in _build(builder, {"json_schema": schema,
                                               "max_new_tokens": 8})[0].json_schema


@pytest.mark.parametrize("ids, bad", [([5, True], True), ([5, 49152], 49152), ([-1, 5], -1),
                                      ([5, 1.0], 1.0), ([5, "6"], "6"), ([None], None)])
def test_input_ids_that_are_not_token_ids_are_refused_by_name(tokenizer, ids, bad):
    """The fast path (C-level type and bound checks) hands any doubt to the per-token loop,
    which names the first bad entry; plain ids and int subclasses other than bool pass."""
    import enum

    builder = RequestBuilder(tokenizer, READY)
    with pytest.raises(InvalidRequestError, match=re.escape(f"got {bad!r}")):
        builder.build(None, {"max_new_tokens": 1}, ids, False, -1, 0, False, None)

    class Token(enum.IntEnum):
        A = 7
    specs, _ = builder.build(None, {"max_new_tokens": 1}, [Token.A, 0, 49151], False, -1, 0,
                             False, None)
    assert specs[0].reqs[0].input_ids == [7, 0, 49151]


def test_equal_sampling_dicts_share_one_built_params_distinct_ones_do_not(tokenizer):
    """One build per distinct dict (a burst's requests share params, and then one object, which
    a hand-off's message pickles once); type and value both tell dicts apart."""
    builder = RequestBuilder(tokenizer, READY)
    a = _build(builder, {"max_new_tokens": 8, "temperature": 0.0}, n=3)
    b = _build(builder, {"temperature": 0.0, "max_new_tokens": 8})
    assert all(sp is a[0] for sp in a + b)
    c = _build(builder, {"max_new_tokens": 8, "temperature": 0})  # an int: validated on its own
    d = _build(builder, {"max_new_tokens": 9, "temperature": 0.0})
    assert c[0] is not a[0] and d[0].max_new_tokens == 9
    for _ in range(2):  # a rejected dict is rejected every time, nothing kept for it
        with pytest.raises(InvalidRequestError, match="temperature"):
            _build(builder, {"max_new_tokens": 8, "temperature": -1.0})


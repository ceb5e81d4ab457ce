"""Upper bounds above the compile limit that no output of the request can reach are dropped
(grammar/compile/vacuous_bounds.py); reachable ones are still rejected by the limits, naming them."""
from __future__ import annotations

import json

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.compile.vacuous_bounds import drop_vacuous_bounds

SCHEMA = {"type": "object", "properties": {
    "body": {"type": "string", "maxLength": 1_000_000, "minLength": 1},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 50}, "maxItems": 500_000},
    "small": {"type": "string", "maxLength": 2048}},
    "examples": [{"body": "x", "maxLength": 10_000_000}]}


def test_only_unreachable_upper_bounds_above_the_limit_go():
    text = json.dumps(SCHEMA)
    out = json.loads(drop_vacuous_bounds(text, limit=100_000, reach=20_000))
    props = out["properties"]
    assert "maxLength" not in props["body"] and props["body"]["minLength"] == 1
    assert "maxItems" not in props["tags"] and props["tags"]["items"]["maxLength"] == 50
    assert props["small"]["maxLength"] == 2048
    assert out["examples"] == SCHEMA["examples"]  # data, not schema
    assert drop_vacuous_bounds(text, limit=100_000, reach=2_000_000) is text  # reachable: kept
    small = json.dumps({"type": "string", "maxLength": 10})
    assert drop_vacuous_bounds(small, limit=100_000, reach=10) is small


def test_engine_admits_a_vacuous_bound_and_rejects_a_reachable_one(engine):
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 1_000_000}},
              "required": ["a"]}
    out = engine.generate("Hi", {"json_schema": json.dumps(schema), "max_new_tokens": 16,
                                 "temperature": 0})
    assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    assert isinstance(json.loads(out["text"])["a"], str)
    with pytest.raises(InvalidRequestError, match="maxLength=1000000 exceeds the limit") as e:
        engine.generate("Hi", {"json_schema": json.dumps(schema), "max_new_tokens": 100_000})
    assert e.value.field == "json_schema"

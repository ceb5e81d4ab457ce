"""Lenient where harmless, precise where not (issue 29 item 5): repeated ``enum`` (and
``required``/``type``) values are served once each, in every draft, while every rejection that
remains names the keyword and its JSON path, from the admission checks, the normalizer and the
backends' own compilers alike."""
from __future__ import annotations

import json
import random
import re

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.lenient import without_repeats
from sgdsl.runtime.grammar.schema.validator import OutputValidator

DRAFT4 = "http://json-schema.org/draft-04/schema#"
REPEATS = {
    "$schema": DRAFT4, "type": "object", "additionalProperties": False,
    "required": ["role", "level", "role"],
    "properties": {
        "role": {"enum": ["admin", "user", "admin", "guest", "user"]},
        "level": {"type": ["integer", "integer"], "enum": [1, 2, 1.0, 3]}}}


def test_repeats_kept_once_in_order_by_json_schema_equality():
    assert without_repeats({"enum": ["a", "b", "a", 1, 1.0, True, {"x": 1}, {"x": 1.0}]}) == \
        {"enum": ["a", "b", 1, True, {"x": 1}]}
    # a property named like a keyword is a name; values of enum/const are data
    nested = {"properties": {"enum": {"enum": [2, 2]}}, "const": {"enum": [1, 1]}}
    assert without_repeats(nested) == {"properties": {"enum": {"enum": [2]}},
                                       "const": {"enum": [1, 1]}}
    plain = {"type": "object", "properties": {"a": {"enum": [1, 2]}}}
    assert without_repeats(plain) is plain  # nothing repeated: the same object


def test_normal_form_has_each_value_once():
    norm = normalize_schema(REPEATS)
    assert norm["properties"]["role"] == {"enum": ["admin", "user", "guest"]}
    assert norm["properties"]["level"]["enum"] == [1, 2, 3]


def test_repeated_enum_schema_is_served(compiler, walker):
    """Admitted by the compile pipeline (the draft-04 meta-schema alone would reject it) and
    every finished walk is valid under the original schema, as the output check reads it."""
    key = GrammarKey.from_constraint("json_schema", json.dumps(REPEATS))
    validator, rng, done = OutputValidator(), random.Random(0), 0
    for _ in range(12):
        text, finished = walker.walk(compiler.compile(key), rng, max_steps=60)
        if finished:
            assert validator.violation(key.text, text) is None, text
            done += 1
    assert done >= 6


def test_repeated_enum_schema_through_the_engine(engine):
    schema = {"$schema": DRAFT4, "enum": ["red", "green", "red", "blue"]}
    out = engine.generate("Pick a color:", {"json_schema": json.dumps(schema),
                                            "max_new_tokens": 16, "temperature": 1.0})
    assert json.loads(out["text"]) in ("red", "green", "blue")


_REJECTED = [  # (schema, keyword, path) as the message must name them
    ({"type": "object", "properties": {"x": {"type": 5}}}, "type", "#/properties/x"),
    ({"properties": {"a": {"maxLength": 10**7}}}, "maxLength", "#/properties/a"),
    ({"properties": {"a": {"type": "string", "pattern": "a{5000}"}}}, "pattern",
     "#/properties/a"),
    ({"oneOf": [{"const": "a"}, {"enum": ["a", "a"]}]}, "oneOf", "#"),
    ({"type": "string", "minLength": 5, "maxLength": 3}, "minLength", "#"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "required", "#"),
    ({"properties": {"a": {"$ref": "#/nope"}}}, "$ref", "#/properties/a"),
    (False, "false", "#"),
    # the backends' own compile errors (a backreference neither can build)
    ({"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}, "code": {
        "type": "string", "pattern": "^(a)\\1$"}}}, "pattern", "#/properties/code"),
]


@pytest.mark.parametrize("schema,keyword,path", _REJECTED,
                         ids=[f"{k}@{p}" for _, k, p in _REJECTED])
def test_every_rejection_names_keyword_and_path(compiler, schema, keyword, path):
    key = GrammarKey.from_constraint("json_schema", json.dumps(schema))
    with pytest.raises(InvalidRequestError) as e:
        compiler.compile(key)
    assert e.value.field == "json_schema" and e.value.status == 400
    named = rf"keyword '{re.escape(keyword)}' at {re.escape(path)}(?![\w/~])"
    assert re.search(named, str(e.value)), str(e.value)


def test_meta_schema_check_runs_once_per_request(compiler, engine):
    """The meta-schema check (jsonschema, pure Python) runs where a request is built (the
    Engine's front end) and, for keys no front end checked (precompiles, direct callers), in
    the compile worker; a request's compile skips it there (``meta_checked``). Either way the
    rejection names the keyword and path."""
    bad = {"type": "string", "description": 5}
    key = GrammarKey.from_constraint("json_schema", json.dumps({**bad, "title": "direct"}))
    with pytest.raises(InvalidRequestError, match=r"keyword 'description' at #(?![\w/~])"):
        compiler.compile(key)
    checked = GrammarKey.from_constraint("json_schema", json.dumps({**bad, "title": "checked"}))
    assert compiler.submit(checked, meta_checked=True).result(wait=True) is not None
    with pytest.raises(InvalidRequestError, match=r"keyword 'description' at #(?![\w/~])"):
        engine.generate("Hi", {"json_schema": json.dumps({**bad, "title": "engine"}),
                               "max_new_tokens": 4})

"""Hostile grammars on the real backends: a clear, typed error (or a correct compile), never a
hang; a slow compile past its deadline does not hold up other requests."""
from __future__ import annotations

import json
import random
import re
import time

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar import GrammarCompiler, GrammarKey, GrammarLimits


def _deep_schema(depth: int) -> dict:
    node: dict = {"type": "integer"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


@pytest.mark.parametrize("kind,value,match", [
    ("json_schema", _deep_schema(60), "depth"),
    ("json_schema", {"type": "array", "items": {"type": "string"}, "maxItems": 10**7}, "maxItems"),
    ("json_schema", {"type": "string", "pattern": "[a-z]{1,100000}"}, "repetition"),
    ("regex", "a{1000000}", "repetition"),
    ("regex", "(ab){5,99999}", "repetition"),
    ("ebnf", 'root ::= "x"{0,500000}', "repetition"),
    ("json_schema", "{not json", "not valid JSON"),
    ("json_schema", '{"type": 5}', "not a valid JSON Schema"),
    ("json_schema", '{"type": "array", "minItems": -1}', "not a valid JSON Schema"),
    ("json_schema", "[1, 2]", "must be a JSON object"),
    ("regex", "x" * (65 * 1024), "bytes"),
])
def test_rejected_at_submit(compiler, kind, value, match):
    key = GrammarKey.from_constraint(kind, value)
    with pytest.raises(InvalidRequestError, match=match) as e:
        if "JSON Schema" in match:  # the meta-schema check runs in the worker (off the loop)
            compiler.compile(key)
        else:
            compiler.submit(key)
    assert e.value.field == kind and e.value.status == 400


@pytest.mark.parametrize("pattern", [r"(a+)+b", r"(a|aa)*c", r"(x+x+)+y"])
def test_catastrophic_regexes_compile_to_automata(compiler, walker, pattern):
    """Backtracking-catastrophic patterns are harmless to automaton compilers: they compile
    (or fail cleanly) and every walk that finishes full-matches."""
    try:
        g = compiler.compile(GrammarKey("regex", pattern))
    except InvalidRequestError as e:
        assert e.field == "regex"
        return
    text, done = walker.walk(g, random.Random(0), max_steps=200)
    assert not done or re.fullmatch(pattern, text, flags=re.S), text


def test_slow_compile_misses_deadline_others_unaffected(backends, tokenizer):
    """A legal but heavy grammar under a tiny deadline fails with a deadline error (its worker
    killed) while a small grammar submitted after it still compiles on the other worker."""
    heavy = {"type": "array", "maxItems": 200,
             "items": {"type": "object", "properties": {
                 # > FAST_BOUND; beside another string branch, so the grammar keeps the
                 # bound (schema/lengths.py)
                 "s": {"anyOf": [{"type": "string", "minLength": 3, "maxLength": 4000},
                                 {"type": "string", "pattern": "^x+$"}]},
                 "n": {"type": "integer", "minimum": -99999, "maximum": 99999}}}}
    c = GrammarCompiler(backends["xgrammar"], timeout_s=0.5, max_workers=2,
                        limits=GrammarLimits(max_repetition=1000))
    try:
        c.compile(GrammarKey("regex", "[a-z]"))  # warm: the workers' start is not timed
        slow = c.submit(GrammarKey.from_constraint("json_schema", heavy))
        quick = c.submit(GrammarKey("regex", "[0-9]+"))
        zero = tokenizer.encode("0", add_special_tokens=False)
        assert quick.result(wait=True).accept_tokens(zero)
        with pytest.raises(InvalidRequestError, match="deadline") as e:
            slow.result(wait=True)
        assert e.value.field == "json_schema"
        for _ in range(500):  # the pool kills the worker at the same deadline, on its thread
            if c.pool.stats.timeouts:
                break
            time.sleep(0.01)
        assert c.pool.stats.timeouts == 1
    finally:
        c.shutdown()


def test_invalid_schema_message_is_clear(compiler):
    bad = json.dumps({"type": "object", "properties": {"a": {"type": "nope"}}})
    with pytest.raises(InvalidRequestError) as e:  # from the worker's meta-schema check
        compiler.compile(GrammarKey("json_schema", bad))
    assert "keyword 'type' at #/properties/a:" in str(e.value)
    assert e.value.field == "json_schema"


def test_backtracking_key_pattern_stays_within_the_time_bound():
    """The unique-keys tracker matches each closed key against the schema's patternProperties
    on the scheduler thread; a backtracking pattern (seconds per key under ``re``) is given
    up on at the time bound and treated as applying, which can only forbid more."""
    from sgdsl.runtime.grammar.guards.json_track import JsonTrack
    from sgdsl.runtime.grammar.schema.arrays import UNIQUE_MARK

    root = {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "array",
                                                                  UNIQUE_MARK: True}},
            "additionalProperties": {"type": "array"}}
    key = "a" * 40 + "b"
    state = JsonTrack(root=root).advance(b'{"' + key.encode() + b'": [')
    assert state.frames[0].last == key and state.frames[-1].unique  # assumed to apply
    fast = JsonTrack(root=root).advance(b'{"aaaa": [')
    assert fast.frames[-1].unique
    other = JsonTrack(root=root).advance(b'{"bbb": [')
    assert not other.frames[-1].unique

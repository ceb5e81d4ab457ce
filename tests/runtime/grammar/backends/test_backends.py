"""Both grammar backends on the same cases: masks agree with accept_token, jump-forward,
termination, rollback, copy, every constraint kind."""
from __future__ import annotations

import json
import random
import re

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar import GrammarKey, jump_forward, only_stop_allowed

from ..helpers import EOS, allowed_ids, feed_text

PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_mask_agrees_with_accept(compiler, tokenizer):
    g = compiler.compile(GrammarKey("regex", r"[0-9]{2,4}-[a-z]+"))
    assert feed_text(g, tokenizer, "12")
    allowed = set(allowed_ids(g))
    rng = random.Random(0)
    sample = rng.sample(range(3, 49152), 300) + sorted(allowed)[:50]
    for t in sample:
        ok = g.accept_token(t)
        assert ok == (t in allowed), (t, tokenizer.decode([t]))
        if ok:
            g.rollback(1)
    assert EOS not in allowed  # "12" is not a complete match


def test_regex_walks_full_match(compiler, tokenizer, walker):
    pattern = r"(yes|no), [0-9]{1,3}( items)?"
    rng = random.Random(1)
    for _ in range(5):
        g = compiler.compile(GrammarKey("regex", pattern))
        text, done = walker.walk(g, rng)
        assert done and re.fullmatch(pattern, text), text
        assert g.is_terminated() and not g.accept_token(EOS)


def test_json_schema_jump_forward_and_stop(compiler, tokenizer):
    g = compiler.compile(GrammarKey.from_constraint("json_schema", PERSON))
    jf = jump_forward(g, tokenizer, [], budget=50)
    assert jf is not None and jf.rollback == 0
    out = list(jf.token_ids)
    assert tokenizer.decode(out).startswith('{"name":')
    for t in tokenizer.encode('Ann"', add_special_tokens=False):
        assert g.accept_token(t)
        out.append(t)
    jf = jump_forward(g, tokenizer, out, budget=50)
    assert jf is not None
    out = out[:len(out) - jf.rollback] + list(jf.token_ids)
    assert '"age":' in tokenizer.decode(out)
    assert feed_text(g, tokenizer, "41}")
    assert only_stop_allowed(g, 49152, [EOS])
    assert json.loads(tokenizer.decode(out) + "41}") == {"name": "Ann", "age": 41}


def test_rollback_restores_mask(compiler, tokenizer):
    g = compiler.compile(GrammarKey.from_constraint("json_schema", PERSON))
    before = allowed_ids(g)
    ids = tokenizer.encode('{"name": "x', add_special_tokens=False)
    if not g.accept_tokens(ids):  # outlines is compact (no spaces)
        ids = tokenizer.encode('{"name":"x', add_special_tokens=False)
        assert g.accept_tokens(ids)
    assert g.num_accepted == len(ids)
    g.rollback(len(ids))
    assert g.num_accepted == 0 and allowed_ids(g) == before


def test_copy_is_independent(compiler, tokenizer):
    g = compiler.compile(GrammarKey("regex", r"a+b|c"))
    assert feed_text(g, tokenizer, "a")
    h = g.copy()
    assert feed_text(h, tokenizer, "b") and h.is_completed()
    assert not g.is_completed() and g.num_accepted == 1 and h.num_accepted == 2


def test_choices(compiler, tokenizer, walker):
    key = GrammarKey.choices(["red", "green", "blue (dark)"])
    seen = set()
    rng = random.Random(2)
    for _ in range(8):
        text, done = walker.walk(compiler.compile(key), rng)
        assert done and text in {"red", "green", "blue (dark)"}
        seen.add(text)
    assert len(seen) >= 2


def test_json_object(compiler, tokenizer, walker):
    rng = random.Random(3)
    done_count = 0
    assert GrammarKey.from_constraint("json_schema", "$$ANY$$") == GrammarKey("json_object", "")
    for key in [GrammarKey("json_object", "")] * 4:
        for _ in range(1):
            text, done = walker.walk(compiler.compile(key), rng)
            if done:
                done_count += 1
                assert isinstance(json.loads(text), dict), text
    assert done_count >= 2


def test_regular_ebnf(compiler, tokenizer, walker):
    ebnf = 'root ::= greeting " " name "!"\ngreeting ::= "hi" | "hello"\nname ::= [A-Z] [a-z]{1,5}'
    rng = random.Random(4)
    for _ in range(4):
        text, done = walker.walk(compiler.compile(GrammarKey("ebnf", ebnf)), rng)
        assert done and re.fullmatch(r"(hi|hello) [A-Z][a-z]{1,5}!", text), text


def test_recursive_ebnf(compilers, tokenizer, walker):
    ebnf = 'root ::= "(" inner ")"\ninner ::= "x" | "(" inner ")"'
    text, done = walker.walk(compilers["xgrammar"].compile(GrammarKey("ebnf", ebnf)),
                             random.Random(5))
    assert done and re.fullmatch(r"\(+x\)+", text) and text.count("(") == text.count(")")
    with pytest.raises(InvalidRequestError, match="recursive") as e:
        compilers["outlines"].compile(GrammarKey("ebnf", ebnf))
    assert e.value.field == "ebnf"


@pytest.mark.parametrize("kind,text", [
    ("regex", "(unclosed"),
    ("ebnf", "root ::= undefined_rule"),
    ("json_schema", '{"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, '
                    '"required": ["a"]}'),
])
def test_compile_errors_name_the_field(compiler, kind, text):
    with pytest.raises(InvalidRequestError) as e:
        compiler.compile(GrammarKey(kind, text))
    assert e.value.field == kind and e.value.status == 400 and str(e.value)


def test_a_pattern_the_backend_cannot_compile_is_named(compiler, backend):
    """A schema the normalizer accepts but the backend fails on (a backreference): the error
    names the pattern's keyword and path and the backend (failure_site.compile_error)."""
    schema = {"type": "object", "properties": {"p": {"type": "string", "pattern": r"^(a)\1$"}}}
    with pytest.raises(InvalidRequestError) as e:
        compiler.compile(GrammarKey("json_schema", json.dumps(schema)))
    assert e.value.field == "json_schema"
    assert f"keyword 'pattern' at #/properties/p cannot be compiled by {backend.name}" in str(
        e.value)

"""uniqueItems over any item type (runtime/grammar/guards/unique_items.py): JSON equality of items as
the tracker reads them (numbers whose end comes later, 1 and 1.0, objects in another key order,
nested arrays), the mask and accept refusing the token that ends a repeated item on both
backends, the one-token dead-end probe, the completion search, and random walks validated with
``jsonschema`` against the original schema."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

from sgdsl.runtime.grammar.guards.json_track import JsonTrack
from sgdsl.runtime.grammar.schema.arrays import UNIQUE_MARK
from sgdsl.runtime.grammar.forcing.shortest import CompletionSearch
from sgdsl.runtime.grammar.guards.unique_items import closed_now

from ..helpers import EOS, VOCAB, allowed_ids, feed_text, guarded, spaced

ANY = {"type": "array", UNIQUE_MARK: True}
DIGITS = {"type": "array", "uniqueItems": True, "minItems": 3, "maxItems": 6,
          "items": {"type": "integer", "minimum": 0, "maximum": 9}}
INTS = {"type": "array", "uniqueItems": True, "items": {"type": "integer"}}
NUMBERS = {"type": "array", "uniqueItems": True, "items": {"type": "number"}}
POINTS = {"type": "array", "uniqueItems": True, "minItems": 2, "items": {
    "type": "object", "additionalProperties": False, "required": ["x", "ok"],
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 2},
                   "ok": {"type": "boolean"}}}}
OPEN_OBJECTS = {"type": "array", "uniqueItems": True,
                "items": {"type": "object", "additionalProperties": {"type": "integer"}}}
NESTED = {"type": "array", "uniqueItems": True, "items": {"type": "array", "maxItems": 2, "items": {
    "type": "integer", "minimum": 0, "maximum": 1}}}
MIXED = {"type": "array", "uniqueItems": True, "items": {"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": 3}, {"type": "boolean"}, {"type": "null"},
    {"type": "string", "maxLength": 2}]}}


def _dup(prefix: bytes, data: bytes) -> bool:
    return JsonTrack(root=ANY).advance(prefix).repeats(data)


def test_numbers_end_at_the_delimiter_and_compare_as_numbers():
    assert not _dup(b"[12, 1", b"") and not _dup(b"[12, 1", b"3")
    assert _dup(b"[1, 1", b",") and _dup(b"[1, 1", b"]") and _dup(b"[1, 1", b" ")
    assert not _dup(b"[12, 1", b",") and not _dup(b"[1, 1", b"2,")  # 1 is a prefix of 12
    assert _dup(b"[1.0, ", b"1]") and _dup(b"[100, 1", b"e2,") and _dup(b"[0, -", b"0]")
    assert not _dup(b"[1, ", b"1.5]") and not _dup(b"[true, ", b"1]")  # true is not 1
    assert _dup(b"[null, true, ", b"true]") and not _dup(b"[null, ", b"false]")
    assert _dup(b'["a", 1, ', b'"\\u0061"')  # the same string, escaped


def test_objects_and_arrays_compare_as_json():
    assert _dup(b'[{"a": 1, "b": [2]}, {"b": [2.0], "a": 1', b"}")
    assert not _dup(b'[{"a": 1, "b": [2]}, {"b": [2, 3], "a": 1', b"}")
    assert _dup(b"[[1, [2]], [1, [2]", b"]") and not _dup(b"[[1, [2]], [[2], 1]", b"")
    assert not _dup(b"[[1, [2]], [1, [2]", b", 3]")
    assert not _dup(b'[{"a": 1}, [', b'{"a": 1}]')  # an item's own items are apart
    state = JsonTrack(root=ANY).advance(b'[{"a": 1}, {"a": 1')  # could close as a repeat
    assert closed_now(state) == closed_now(JsonTrack(root=ANY).advance(b'[{"a": 1}, {"a": 1'))
    assert closed_now(state) in state.frames[0].names


def _refused(g, tokenizer, text: str) -> bool:
    """True if the last token of ``text`` (after the others are taken) is masked and refused;
    the grammar is left as it was."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert g.accept_tokens(ids[:-1])
    masked = ids[-1] not in allowed_ids(g)
    ok = g.accept_token(ids[-1])
    g.rollback(len(ids) - 1 + ok)
    assert masked == (not ok), text
    return masked


def test_repeated_number_cannot_end(backend, quotes, tokenizer):
    g = guarded(backend, quotes, INTS)
    assert feed_text(g, tokenizer, spaced(backend, "[1,12,"))
    assert _refused(g, tokenizer, "1,") and _refused(g, tokenizer, "1]")
    assert _refused(g, tokenizer, "12]") and not _refused(g, tokenizer, "13]")
    assert not _refused(g, tokenizer, "10,")
    n = guarded(backend, quotes, NUMBERS)
    assert feed_text(n, tokenizer, spaced(backend, "[1.0,"))
    assert _refused(n, tokenizer, "1]") and not _refused(n, tokenizer, "1.5]")


def test_repeated_object_cannot_close_in_any_key_order(backend, quotes, tokenizer):
    g = guarded(backend, quotes, OPEN_OBJECTS)
    assert feed_text(g, tokenizer, spaced(backend, '[{"a":1,"b":2},'))
    assert _refused(g, tokenizer, spaced(backend, '{"b":2,"a":1}'))
    assert not _refused(g, tokenizer, spaced(backend, '{"b":2,"a":3}'))


def test_dead_end_one_token_ahead_is_avoided(backend, quotes, tokenizer):
    """Under maximum 9 a digit equal to an earlier item could only end as a repeat: masked
    itself, as is the value that would complete an object equal to an earlier one."""
    g = guarded(backend, quotes, DIGITS)
    assert feed_text(g, tokenizer, spaced(backend, "[3,"))
    allowed = allowed_ids(g)
    digit = lambda d: tokenizer.encode(str(d), add_special_tokens=False)[-1]  # noqa: E731
    assert digit(3) not in allowed and digit(4) in allowed and not g.accept_token(digit(3))
    p = guarded(backend, quotes, POINTS)
    assert feed_text(p, tokenizer, spaced(backend, '[{"x":1,"ok":true},{"x":1,"ok":'))
    word = tokenizer.encode("true", add_special_tokens=False)
    if len(word) == 1:
        assert word[0] not in allowed_ids(p)


@pytest.mark.parametrize("schema", [DIGITS, POINTS, NESTED, MIXED], ids=["digits", "points",
                                                                        "nested", "mixed"])
def test_walks_and_completions_stay_unique(backends, quotes, tokenizer, walker, schema):
    backend = backends["xgrammar"]
    assert walker.valid_walks(lambda: guarded(backend, quotes, schema), schema,
                              random.Random(7), walks=6, max_steps=160) >= 3
    g = guarded(backend, quotes, schema)
    assert feed_text(g, tokenizer, "[")
    found = CompletionSearch(tokenizer, VOCAB, [EOS]).search(g)
    assert found is not None
    jsonschema.validate(json.loads("[" + found.text), schema)


def test_outlines_walks_stay_unique(backends, quotes, walker):
    rng = random.Random(3)
    for schema in (DIGITS, MIXED):
        walker.valid_walks(lambda: guarded(backends["outlines"], quotes, schema), schema, rng,
                           walks=1, max_steps=160)

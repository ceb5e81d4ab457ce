"""Unique object keys (runtime/grammar/guards/unique_keys.py) on both backends: the JSON structure
tracker, the bitmask and accept refusing a key its object already has (escaped spellings too),
nested objects keeping their own keys, rollback/copy, the shortest completion choosing a fresh
key for minProperties, and random walks whose outputs never repeat a key."""
from __future__ import annotations

import json
import random

import pytest
import torch

from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.forcing.shortest import CompletionSearch
from sgdsl.runtime.grammar.guards.json_track import JsonTrack
from sgdsl.runtime.grammar.guards.unique_keys import UniqueKeyGrammar

from ..helpers import EOS, VOCAB, allowed_ids, feed_text, guarded, spaced

OPEN = {"type": "object", "additionalProperties": {"type": "integer"}}
COUNTED = {**OPEN, "minProperties": 2, "maxProperties": 3}  # xgrammar only (outlines rejects it)


def _guarded(backend, quotes, schema) -> UniqueKeyGrammar:
    key = GrammarKey.from_constraint("json_schema", json.dumps(schema))
    return UniqueKeyGrammar(backend.new_grammar(backend.compile(key)), quotes)


def test_key_state_follows_structure():
    s = JsonTrack().advance(b'{"a": 1, "b": {"a": [1, {"c": "x\\"y"}]}, "')
    assert s.buf == b"" and s.frames[-1].names == {"a", "b"} and s.frames[-1].expect_key
    assert s.closes_duplicate(b'a"') and s.closes_duplicate(b'b":') and not s.closes_duplicate(b'c"')
    inner = JsonTrack().advance(b'{"a": 1, "b": {"')
    assert not inner.closes_duplicate(b'a"')  # the nested object has no keys yet
    escaped = JsonTrack().advance(b'{"ab": 1, "a')
    assert escaped.closes_duplicate(b'\\u0062"')  # "a\u0062" is the key "ab"
    assert not JsonTrack().advance(b'{"a": "').closes_duplicate(b'a"')  # a value, not a key


def test_duplicate_key_masked_and_rejected(backend, quotes, tokenizer):
    g = _guarded(backend, quotes, OPEN)
    assert feed_text(g, tokenizer, spaced(backend, '{"name":1,"'))
    dup = tokenizer.encode('name"', add_special_tokens=False)
    assert g.accept_tokens(dup[:-1])  # the key's text so far is fine
    close = dup[-1]
    assert close not in allowed_ids(g)
    assert not g.accept_token(close)
    other = tokenizer.encode('names"', add_special_tokens=False)
    g.rollback(len(dup) - 1)
    assert g.accept_tokens(other)  # a longer key is a new key


def test_rollback_and_copy_restore_keys(backend, quotes, tokenizer):
    g = _guarded(backend, quotes, OPEN)
    assert feed_text(g, tokenizer, spaced(backend, '{"x":1,"'))
    twin = g.copy()
    ids = tokenizer.encode(spaced(backend, 'y":2,"'), add_special_tokens=False)
    assert g.accept_tokens(ids)
    assert not feed_text(g, tokenizer, 'y"')
    g.rollback(len(ids))
    assert feed_text(g, tokenizer, 'y"') and feed_text(twin, tokenizer, 'y"')


def test_completion_picks_a_fresh_key(backends, quotes, tokenizer):
    g = _guarded(backends["xgrammar"], quotes, COUNTED)
    assert feed_text(g, tokenizer, '{"": 1')  # the shortest next key would be "" again
    found = CompletionSearch(tokenizer, VOCAB, [EOS]).search(g)
    assert found is not None
    value = json.loads('{"": 1' + found.text)
    assert 2 <= len(value) <= 3, found.text


def test_search_merges_states_apart_only_in_their_keys(backends, quotes, tokenizer):
    """The uniform-cost search (outlines: exact keys) merges states by structure, not by the
    keys each object has: with those in the key, ``,"":""`` then ``,"1":""`` ... each made a
    new state, and the search spent its 256 expansions adding members of every spelling to the
    free-keyed object instead of closing it and writing the required rest (Snowplow sp_264
    was cut at max_new_tokens: the tracker never had a plan)."""
    strings = {"type": "array", "items": {"type": "string"}}
    later = ["mktContent", "mktMedium", "mktSource", "mktTerm"]
    schema = {"type": "object", "required": ["fields", "vendor"], "properties": {
        "fields": {"type": "object", "required": ["a", *later], "properties": {
            "a": {"type": "object", "additionalProperties": {"type": "string"}},
            **{name: strings for name in later}}},
        "vendor": {"type": "string"}}}
    g = _guarded(backends["outlines"], quotes, schema)
    prefix = '{"fields":{"a":{",":"","11'
    assert feed_text(g, tokenizer, prefix)
    found = CompletionSearch(tokenizer, VOCAB, [EOS], max_expansions=256).search(g)
    assert found is not None
    value = json.loads(prefix + found.text)
    assert value["fields"]["a"] == {",": "", "11": ""} and value["vendor"] == "", found.text


def test_random_walks_never_repeat_keys(backends, quotes, tokenizer, walker):
    rng = random.Random(0)
    done = 0
    for _ in range(6):  # short keys (the walker favours closing quotes) must all differ
        g = _guarded(backends["xgrammar"], quotes, {**OPEN, "minProperties": 6})
        text, complete = walker.walk(g, rng, max_steps=300)
        if not complete:
            continue
        pairs = json.loads(text, object_pairs_hook=lambda p: p)
        assert len({k for k, _ in pairs}) == len(pairs) >= 6, text
        done += 1
    assert done >= 3


def test_dead_end_lets_the_duplicate_through(backends, quotes, tokenizer):
    """xgrammar matches a key pattern whole: ``^x_`` allows the one key "x_", and after
    ``{"x_": 1, "x_`` only the duplicate's quote is left; masking it would leave no token."""
    schema = {"type": "object", "patternProperties": {"^x_": {"type": "integer"}},
              "additionalProperties": False}
    g = _guarded(backends["xgrammar"], quotes, schema)
    assert feed_text(g, tokenizer, '{"x_": 1, "x_')
    allowed = allowed_ids(g)
    assert allowed and feed_text(g, tokenizer, '": 2}')


@pytest.mark.parametrize("schema, is_open", [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, False),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}},
      "additionalProperties": False}, False),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, True),
    ({"type": "object", "properties": {"a": {"type": "object"}}}, True),  # a free-form object
    ({"type": "object", "properties": {"a": {}}}, True),  # any value: objects included
    ({"type": "object", "patternProperties": {"^x": {}}, "additionalProperties": False}, True),
    ({"$defs": {"m": {"type": "object", "additionalProperties": True}},
      "type": "array", "items": {"$ref": "#/$defs/m"}}, True),
])
def test_guard_only_where_keys_are_free(schema, is_open):
    from sgdsl.runtime.grammar.guards.unique_keys import has_open_keys

    assert has_open_keys("json_schema", json.dumps(schema)) is is_open
    assert has_open_keys("json_object", "")


TAGS = {"type": "object", "properties": {
    "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 3},
    "notes": {"type": "array", "items": {"type": "string"}}}, "required": ["tags", "notes"]}


def test_unique_string_items_only_where_the_schema_says(backend, quotes, tokenizer):
    """uniqueItems over strings is admitted and kept by the runtime: a repeated item of "tags"
    cannot close, a repeated item of "notes" (no uniqueItems) can."""
    g = guarded(backend, quotes, TAGS)
    assert feed_text(g, tokenizer, spaced(backend, '{"tags":["red","blue",'))
    assert feed_text(g, tokenizer, '"re')
    assert not feed_text(g, tokenizer, 'd"')
    assert feed_text(g, tokenizer, 'x"') and feed_text(g, tokenizer, spaced(backend, '],"notes":["a",'))
    assert feed_text(g, tokenizer, '"a"')  # notes may repeat


def test_unique_items_through_refs_and_nested_arrays(backends, quotes, tokenizer):
    schema = {"$defs": {"names": {"type": "array", "items": {"type": "string"},
                                  "uniqueItems": True}},
              "type": "array", "items": {"$ref": "#/$defs/names"}}
    g = guarded(backends["xgrammar"], quotes, schema)
    assert feed_text(g, tokenizer, '[["a", "b"], ["a", ')  # another inner array: its own items
    assert not feed_text(g, tokenizer, '"a"')
    assert feed_text(g, tokenizer, '"b", "c"]]')


def test_unique_items_completion_and_walks(backends, quotes, tokenizer, walker):
    g = guarded(backends["xgrammar"], quotes, TAGS)
    assert feed_text(g, tokenizer, '{"tags": ["')
    found = CompletionSearch(tokenizer, VOCAB, [EOS]).search(g)
    tags = json.loads('{"tags": ["' + found.text)["tags"]
    assert len(tags) == len(set(tags)) >= 3, found.text
    walker.valid_walks(lambda: guarded(backends["xgrammar"], quotes, TAGS), TAGS,
                       random.Random(1), walks=4)


def _wrapped_step(backend, quotes, tokenizer, prefetched: bool):
    """Requests under open keys after one more sampled token each, stepped by a manager with
    or without the mask prefetch (whose helper thread then accepts and fills them)."""
    from sgdsl.runtime.grammar.forcing.budget import Budget
    from sgdsl.runtime.grammar.manager import GrammarManager
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.scheduler.finish import FinishChecker
    from sgdsl.runtime.scheduler.req import Req

    from ..helpers import shared_compiler

    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    cases = [('{"name": 1, "', "name"), ('{"a": 1, "b": 2, "', "x"), ('{"a": 1', ","),
             ('{"a": 1, "b": 2', "}")]
    manager = GrammarManager(backend, tokenizer, VOCAB, [EOS], jump_forward=False,
                             compiler=shared_compiler(backend))
    reqs = []
    for i, (text, nxt) in enumerate(cases):
        req = Req(f"r{i}", [1, 2], SamplingParams(json_schema=json.dumps(OPEN),
                                                  max_new_tokens=64))
        req.grammar = _guarded(backend, quotes, OPEN)
        assert feed_text(req.grammar, tokenizer, text)
        req.output_ids = enc(text) + [enc(nxt)[-1]]
        req.completion = Budget(check_at=1 << 30, search_at=1 << 30)
        reqs.append(req)
    prefetch = manager.prefetch(reqs) if prefetched else None
    manager.after_sample(reqs, FinishChecker([EOS], None), batch_size=len(reqs),
                         prefetch=prefetch)
    bitmask = manager.fill_bitmask(reqs, None, prefetch)
    manager.shutdown()
    return reqs, bitmask, prefetch


def test_wrapped_rows_go_to_the_mask_prefetch(backends, quotes, tokenizer):
    """Open-key rows (JSON-object mode) are accepted and filled on the prefetch's helper
    thread like plain ones, with the same rows as on the scheduler thread: the duplicate
    key's closing quote masked, the finished value's row left open."""
    backend = backends["xgrammar"]
    ref, ref_mask, _ = _wrapped_step(backend, quotes, tokenizer, prefetched=False)
    got, mask, prefetch = _wrapped_step(backend, quotes, tokenizer, prefetched=True)
    assert prefetch is not None and prefetch.filled == {0, 1, 2}
    assert [r.finish_reason for r in got] == [r.finish_reason for r in ref]
    assert got[3].finish_reason["type"] == "stop" and got[0].finish_reason is None
    assert torch.equal(mask, ref_mask)
    closers = [t for t in quotes.ids.tolist() if quotes.bytes[t].startswith(b'"')]
    allowed = lambda t: (int(mask[0, t // 32]) >> (t % 32)) & 1  # noqa: E731
    assert closers and not any(allowed(t) for t in closers)  # "name" again: masked

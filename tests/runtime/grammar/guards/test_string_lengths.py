"""String lengths the runtime enforces (schema/lengths.py marks them, string_chars.py counts
them, unique_keys.UniqueKeyGrammar masks them): counting with escapes, multi-byte characters
and split tokens; the mask at the bound and its absence far from it; minLength; accept
refusing what the mask clears; jump-forward and shortest completions within the bound; where
a bound is marked and where it stays in the grammar; random walks on both backends."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from sgdsl.runtime.grammar import allocate_bitmask
from sgdsl.runtime.grammar.guards.json_track import JsonTrack
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.lengths import LENGTH_MARK
from sgdsl.runtime.grammar.forcing.shortest import CompletionSearch
from sgdsl.runtime.grammar.guards.string_chars import ESC, NORMAL, scan
from sgdsl.runtime.grammar.guards.unique_keys import UniqueKeyGrammar

from ..helpers import EOS, VOCAB, allowed_ids, feed_text, guarded

NAME = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 140}},
        "required": ["name"], "additionalProperties": False}
CODE = {"type": "string", "minLength": 130, "maxLength": 134}


def _guarded(backend, quotes, schema) -> UniqueKeyGrammar:
    g = guarded(backend, quotes, schema)
    assert g.min_hi is not None
    return g


def _open_name(backend) -> str:
    return '{"name":"' if backend.name == "outlines" else '{"name": "'


def test_scan_counts_code_points():
    assert scan("aé€😀".encode()) == (4, -1, NORMAL)
    assert scan(b'ab\\n\\"c"rest') == (5, 7, NORMAL)  # \n and \" are one character each
    assert scan(b"\\u00e9x") == (2, -1, NORMAL)
    assert scan(b"x\\u00") == (2, -1, 2)  # a split escape: counted once, two digits to come
    assert scan(b'e9"', 2) == (0, 2, NORMAL)
    assert scan(b'"', ESC) == (0, -1, NORMAL)  # an escaped quote does not close
    assert scan("é".encode()[1:] + b"a") == (1, -1, NORMAL)  # a split character's tail


def test_track_counts_split_tokens_and_escapes():
    root = normalize_schema(NAME)
    s = JsonTrack(root=root).advance(b'{"name": "')
    assert s.bound == (0, 140, None) and s.count == 0
    for part in (b"ab\\", b"u00", "e9é".encode()[:-1], "é".encode()[-1:], b"\\n"):
        s = s.advance(part)
    assert s.count == 5 and s.lex == NORMAL, s  # a, b, \u00e9, é, \n
    assert not s.breaks_bound(b"x" * 135 + b'"}') and s.breaks_bound(b"x" * 136)
    assert s.advance(b'"}').bound is None
    key = JsonTrack(root=root).advance(b'{"')
    assert key.bound is None  # a key has no length bound


def test_mask_at_the_bound_only(backend, quotes, tokenizer):
    g = _guarded(backend, quotes, NAME)
    assert feed_text(g, tokenizer, _open_name(backend) + "a" * 10)
    assert len(allowed_ids(g)) > 20000  # far from the bound: the grammar's row as it was
    assert feed_text(g, tokenizer, "b" * 130)
    # NOTE: special tokens (no bytes) are text-free: xgrammar allows them inside strings
    at_bound = [quotes.bytes[t] for t in allowed_ids(g) if quotes.bytes[t] is not None]
    assert at_bound and all(b.startswith(b'"') for b in at_bound), at_bound[:20]
    assert not feed_text(g, tokenizer, "c")
    assert feed_text(g, tokenizer, '"}')


def test_mask_one_char_short_allows_one_char_tokens(backends, quotes, tokenizer):
    g = _guarded(backends["xgrammar"], quotes, NAME)
    assert feed_text(g, tokenizer, '{"name": "' + "é" * 139)
    for t in allowed_ids(g):
        data = quotes.bytes[t] or b""
        assert scan(data, g._states[-1].lex)[0] <= 1, data
    assert feed_text(g, tokenizer, "\\n") and not feed_text(g, tokenizer, "x")


def test_min_length_holds_the_quote(backend, quotes, tokenizer):
    g = _guarded(backend, quotes, CODE)
    assert feed_text(g, tokenizer, '"' + "a" * 129)
    assert not feed_text(g, tokenizer, '"')
    closing = [b for b in (quotes.bytes[t] or b"" for t in allowed_ids(g)) if scan(b)[1] >= 0]
    assert closing and all(scan(b)[0] >= 1 for b in closing), closing[:20]
    assert feed_text(g, tokenizer, "b") and feed_text(g, tokenizer, '"')


def test_opening_token_cannot_close_short(backends, quotes, tokenizer):
    """A token that opens and closes a string at once (``""``) is checked against the bound
    of the string it opens."""
    schema = {"type": "array", "items": {"type": "string", "minLength": 130}}
    g = _guarded(backends["xgrammar"], quotes, schema)
    assert feed_text(g, tokenizer, "[")
    empty = tokenizer.encode('""', add_special_tokens=False)
    assert len(empty) == 1 and empty[0] not in allowed_ids(g)
    assert not g.accept_token(empty[0])


def test_rollback_and_copy_keep_counts(backends, quotes, tokenizer):
    g = _guarded(backends["xgrammar"], quotes, NAME)
    assert feed_text(g, tokenizer, '{"name": "' + "a" * 139)
    twin = g.copy()
    assert feed_text(g, tokenizer, "b") and not feed_text(g, tokenizer, "c")
    g.rollback(1)
    assert feed_text(g, tokenizer, "c") and feed_text(twin, tokenizer, "d")
    assert not feed_text(twin, tokenizer, "e")


def test_jump_forward_cut_at_the_bound(backends, quotes, tokenizer):
    """Forced text that would pass the bound is cut there (defensive: the mask keeps a row
    out of such a state; here the state is reached through the inner grammar)."""
    schema = {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*@example[.]com$", "maxLength": 30}
    g = _guarded(backends["xgrammar"], quotes, schema)
    assert feed_text(g, tokenizer, '"' + "a" * 20)
    at = tokenizer.encode("@", add_special_tokens=False)
    assert g.inner.accept_tokens(at)
    g._states.append(g._states[-1].advance(b"@"))
    forced = g.inner.jump_forward_string()
    assert forced.startswith("example.com")
    assert g.jump_forward_string() == "example.c"  # 21 + 9 = 30 characters


def test_shortest_completion_respects_bounds(backend, quotes, tokenizer):
    g = _guarded(backend, quotes, CODE)
    assert feed_text(g, tokenizer, '"ab')
    found = CompletionSearch(tokenizer, VOCAB, [EOS]).search(g)
    assert found is not None and 130 <= len(json.loads('"ab' + found.text)) <= 134, found


@pytest.mark.parametrize("schema, marked", [
    ({"type": "string", "maxLength": 140}, True),
    ({"type": "string", "maxLength": 128}, False),  # cheap in the grammar
    ({"type": "string", "minLength": 129}, True),
    ({"anyOf": [{"type": "string", "maxLength": 140}, {"type": "integer"}]}, True),
    ({"anyOf": [{"type": "string", "maxLength": 140}, {"type": "string", "pattern": "^x+$"}]},
     False),  # the loosest bound over both would not be exact
    ({"type": "object", "propertyNames": {"maxLength": 140}}, False),
])
def test_where_bounds_are_marked(schema, marked):
    assert (LENGTH_MARK in json.dumps(normalize_schema(schema))) is marked


def test_bounds_past_the_schema_budget_are_counted_at_runtime():
    """One bound up to GRAMMAR_MAX stays in the grammar, but their sum over a schema is
    bounded too (compile time grows with it): the largest go to the runtime first; equal
    bounds compile once, so they count once."""
    string = {"type": "string"}
    out = normalize_schema({"type": "object", "properties": {
        "a": {**string, "maxLength": 100}, "b": {**string, "maxLength": 90},
        "c": {**string, "maxLength": 20}, "d": {**string, "pattern": "^[a-z]*$", "maxLength": 90}}})
    props = out["properties"]
    assert [LENGTH_MARK in props[k] for k in "abcd"] == [True, True, False, False]
    assert props["d"]["pattern"] == "^[a-z]{0,90}$"
    shared = normalize_schema({"type": "object", "properties": {
        k: {**string, "maxLength": 100} for k in "abc"}})
    assert LENGTH_MARK not in json.dumps(shared)


def test_unfoldable_pattern_bound_counted_at_runtime():
    out = normalize_schema({"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 20})
    assert out[LENGTH_MARK] == [0, 20] and "maxLength" not in out


URL = {"type": "string", "pattern": "^([Hh][Tt][Tt][Pp][Ss]?)://.+$", "maxLength": 2000}


def test_a_fold_into_large_counts_is_left_to_the_runtime():
    """Folding maxLength 2000 into this pattern spells ``.{1,1993}`` (winget's schema had seven:
    past the compile deadline); alone, the runtime counts instead and the pattern stays as
    written; beside another string branch it cannot count, and the exact fold is used."""
    out = normalize_schema(URL)
    assert out[LENGTH_MARK] == [0, 2000] and out["pattern"] == URL["pattern"]
    shared = normalize_schema({"anyOf": [URL, {"type": "string", "enum": ["q"]}]})
    folded = [b for b in shared["anyOf"] if "pattern" in b][0]
    assert "{1,1993}" in folded["pattern"] and LENGTH_MARK not in folded
    assert not {"maxLength", "minLength"} & set(folded)
    small = normalize_schema({**URL, "maxLength": 40})  # small counts stay in the grammar
    assert LENGTH_MARK not in small and "{1,33}" in small["pattern"]


def test_counted_url_pattern_walks_stay_valid(backend, quotes, tokenizer, walker):
    schema = {**URL, "maxLength": 150}  # anchored: jsonschema's search is a full match
    assert walker.valid_walks(lambda: _guarded(backend, quotes, schema), schema,
                              random.Random(5), walks=4) >= 2


def test_random_walks_stay_within_bounds(backend, quotes, tokenizer, walker):
    schema = {"type": "array", "minItems": 2, "maxItems": 3,
              "items": {"type": "string", "minLength": 130, "maxLength": 132}}
    rng = random.Random(3)
    done = 0
    for _ in range(5):
        text, complete = walker.walk(_guarded(backend, quotes, schema), rng, max_steps=700)
        if complete:
            items = json.loads(text)
            assert all(130 <= len(s) <= 132 for s in items), text
            done += 1
    assert done >= 2


def test_pattern_bound_steers_clear_of_dead_ends(backends, quotes, tokenizer):
    """``^[a-z]+(-[a-z]+)*$`` with 2 characters of room: "-" alone would leave one for the
    letter the pattern then needs (fine), but with 1 character left "-" is a dead end:
    masked, and so is a 2-character token ending in "-"."""
    schema = {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 20}
    g = _guarded(backends["xgrammar"], quotes, schema)
    assert feed_text(g, tokenizer, '"' + "a" * 18)
    dash = tokenizer.encode("-", add_special_tokens=False)[0]
    assert dash in allowed_ids(g)
    assert feed_text(g, tokenizer, "b")
    allowed = [quotes.bytes[t] for t in allowed_ids(g) if quotes.bytes[t]]
    assert dash not in allowed_ids(g)
    assert b"c" in allowed and all(not b.endswith(b"-") for b in allowed), allowed[:20]


def test_pattern_bound_walks_end_valid(backend, quotes, tokenizer, walker):
    schema = {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 18}}
    assert walker.valid_walks(lambda: _guarded(backend, quotes, schema), schema,
                              random.Random(5), walks=4, max_steps=120) >= 2


def test_dead_end_row_is_left_as_filled(backends, quotes, tokenizer):
    """A pattern that cannot end within the bound: the row the grammar filled is kept
    (never an empty row); the request's output check then fails it."""
    schema = {"type": "string", "pattern": "^a+(-b+)*-ccc$", "maxLength": 20}
    g = _guarded(backends["xgrammar"], quotes, schema)
    assert feed_text(g, tokenizer, '"' + "a" * 18 + "-")
    row = allocate_bitmask(1, VOCAB)
    g.fill_bitmask(row, 0)
    assert np.asarray(row.numpy()).any()

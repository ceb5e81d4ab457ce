"""Shortest completions of outlines DFAs read from the table built at compile time
(runtime/grammar/backends/outlines_completion.py): shortest in characters, taken by the search without
searching, and left to the search where the table has no answer (states only non-ASCII text
reaches, a grammar past MAX_STATES, a path a wrapper's guard refuses)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.backends import outlines_completion
from sgdsl.runtime.grammar.forcing.shortest import CompletionSearch

from ..helpers import EOS, VOCAB

REALWORLD = Path(__file__).parents[3] / "data" / "schemas" / "realworld"


@pytest.fixture()
def outlines(backends):
    return backends["outlines"]


def _search(tokenizer, **kw) -> CompletionSearch:
    return CompletionSearch(tokenizer, VOCAB, [EOS], **kw)


def _engine_key(tokenizer, schema: dict, max_new_tokens: int) -> GrammarKey:
    """The key the engine compiles for a request of ``max_new_tokens`` (request_builder.py)."""
    from sgdsl.runtime.grammar.compile.limits import GrammarLimits
    from sgdsl.runtime.grammar.compile.vacuous_bounds import drop_vacuous_bounds, longest_token_bytes

    reach = max_new_tokens * longest_token_bytes(tokenizer)
    text = drop_vacuous_bounds(json.dumps(schema), GrammarLimits().max_schema_bound, reach)
    return GrammarKey("json_schema", text)


def test_a_large_dfa_completes_within_the_usual_bound(outlines, tokenizer):
    """Snowplow sp_400 (optional members: thousands of DFA states) was cut at 384 tokens: from
    inside its first array the 256-expansion search found nothing. The table answers, and the
    value it completes is valid."""
    schema = json.loads((REALWORLD / "Snowplow__sp_400_Normalized.json").read_text())
    grammar = outlines.new_grammar(outlines.compile(_engine_key(tokenizer, schema, 384)))
    prefix = '{"autoPlay":true,"avaliablePlaybackRates":[1.00,2.00,3.00'
    assert grammar.accept_tokens(tokenizer.encode(prefix, add_special_tokens=False))
    search = _search(tokenizer, max_expansions=256)
    found = search.search(grammar)
    assert found is not None and search.known == 1
    assert grammar.accept_tokens(found.token_ids) and grammar.is_completed()
    jsonschema.validate(json.loads(prefix + found.text), schema)


@pytest.mark.parametrize("regex,expected", [
    (r"(ab)*c", "c"),
    (r"(xyz|ab)+q", "abq"),
    (r"\d{4}-\d{2}", "0000-00"),
    (r"[a-z]+@[a-z]+\.com", "a@a.com"),
    (r"(true|false|[0-9]{3})", "000"),
])
def test_table_paths_are_shortest_in_characters(outlines, tokenizer, regex, expected):
    grammar = outlines.new_grammar(outlines.compile(GrammarKey("regex", regex)))
    ids = grammar.known_completion()
    assert ids is not None and tokenizer.decode(list(ids)) == expected
    assert grammar.num_accepted == 0  # read from the table: the matcher did not move
    found = _search(tokenizer, max_expansions=0).search(grammar)  # no expansions needed
    assert found is not None and found.text == expected


def test_states_without_an_entry_are_searched(outlines, tokenizer):
    """Only non-ASCII text reaches past "h" here: no entry, the search answers."""
    grammar = outlines.new_grammar(outlines.compile(GrammarKey("regex", "héllo|wörld+")))
    assert grammar.known_completion() is None
    search = _search(tokenizer)
    assert search.search(grammar).text == "héllo" and search.known == 0


def test_a_grammar_past_the_state_bound_has_no_table(outlines, tokenizer, monkeypatch):
    monkeypatch.setattr(outlines_completion, "MAX_STATES", 4)
    compiled = outlines.compile(GrammarKey("regex", "[a-z]{10}"))
    assert compiled.completions is None
    grammar = outlines.new_grammar(compiled)
    assert grammar.known_completion() is None
    assert _search(tokenizer).search(grammar).text == "a" * 10


def test_a_path_the_key_guard_refuses_is_searched(outlines, tokenizer):
    """The table knows the DFA, not the duplicate-key guard wrapped around it: its shortest
    path from '{"":1,"' repeats the key "", which the guard refuses; the search then finds
    a completion with a new key."""
    from sgdsl.runtime.grammar.guards.unique_keys import build_quote_tokens, guard_keys

    key = GrammarKey("json_object", "")
    grammar = guard_keys(outlines.new_grammar(outlines.compile(key)), key,
                         build_quote_tokens(tokenizer, VOCAB), "outlines")
    prefix = '{"":1,"'
    assert grammar.accept_tokens(tokenizer.encode(prefix, add_special_tokens=False))
    assert tokenizer.decode(list(grammar.known_completion())).startswith('"')
    search = _search(tokenizer)
    found = search.search(grammar)
    assert found is not None and search.known == 0
    pairs = json.loads(prefix + found.text, object_pairs_hook=list)
    assert len({k for k, _ in pairs}) == len(pairs) == 2

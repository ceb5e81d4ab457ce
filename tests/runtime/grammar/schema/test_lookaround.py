"""Lookahead idioms spelled without lookarounds (``schema/lookaround.py``): the rewrite matches
exactly the strings the original pattern does (compared with Python's ``re`` over random and
edge strings; a trailing newline is left out, where Python's ``$`` differs from ECMA-262's),
xgrammar enforces it, and other lookarounds are still rejected naming the keyword."""
from __future__ import annotations

import json
import random
import re

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.lookaround import without_lookaround
from sgdsl.runtime.grammar.schema.patterns import Unfoldable
from sgdsl.runtime.grammar.schema.validator import validator_class

PAPER = r"^(?!io\.papermc\.)([a-zA-Z_$][a-zA-Z\d_$]*\.)*[a-zA-Z_$][a-zA-Z\d_$]*$"
CLYDE = r"^((?!(c|C)(l|L)(y|Y)(d|D)(e|E)).)*$"
CASES = [
    (PAPER, "io.papermcxIOP_$1", ["io.papermc.x", "io.papermc", "io.paperm.c", "io.x", "io",
                                  "a.b", "io.papermc.a.b", "io.papermcx.y", ".a", ""]),
    (CLYDE, "clydeCLYDEx \t", ["clyde", "xClYdEx", "clyd", "cclyde", "ccly", "", "a\nb",
                               "clydclyde", "Clyd e"]),
    (r"^(?!ab)[a-c]*$", "abc", ["ab", "abc", "a", "", "ba", "aab"]),
    (r"^(?!x-)[a-z-]+$", "x-a", ["x-", "x", "x-a", "xa", "-x", "a"]),
    (r"^(?!c)[^a-]+$", "abc-", ["b", "c", "cb", "-", "bc", "a"]),  # c joins a negated class
]


@pytest.mark.parametrize("pattern,alphabet,edges", CASES, ids=[c[0][:24] for c in CASES])
def test_rewrite_matches_exactly_the_original(pattern, alphabet, edges):
    spelled = without_lookaround(pattern)
    assert "(?" not in spelled
    rng = random.Random(5)
    pool = edges + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 13)))
                    for _ in range(4000)]
    pool += [e[:k] + rng.choice(alphabet) + e[k:] for e in edges for k in range(len(e) + 1)]
    matched = 0
    for s in pool:
        if s.endswith("\n"):
            continue
        want = re.search(pattern, s) is not None
        matched += want
        assert (re.fullmatch(spelled, s) is not None) == want, (pattern, spelled, s)
    assert 0 < matched < len(pool)


@pytest.mark.parametrize("pattern", [
    r"^(?=a)\w+$",  # positive lookahead
    r"^(?!a|b)\w+$",  # more than one literal
    r"^\w+(?<!x)$",  # lookbehind
    r"^((?!aa).)*$",  # the word's sets overlap (a restarts inside it)
    r"^(?!a)\w+",  # not anchored at its end
])
def test_other_lookarounds_are_still_rejected(pattern):
    with pytest.raises(Unfoldable):
        without_lookaround(pattern)
    with pytest.raises(InvalidRequestError, match="'pattern' at #/properties/p"):
        normalize_schema({"type": "object", "properties": {
            "p": {"type": "string", "pattern": pattern}}})


def test_xgrammar_enforces_the_spelled_patterns():
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    for pattern, strings in ((CLYDE, ["clyde", "my cLYde", "clyd", "cl yde", "", "ccclyd"]),
                             (PAPER, ["io.papermc.x", "io.papermcx.y", "io.x", "a.b.c"])):
        norm = normalize_schema({"type": "string", "pattern": pattern})
        grammar = Grammar.from_json_schema(json.dumps(norm), any_whitespace=False)
        for s in strings:
            want = re.search(pattern, s) is not None
            assert _is_grammar_accept_string(grammar, json.dumps(s)) == want, (pattern, s)


def test_pattern_property_names_are_spelled_too():
    schema = {"type": "object", "additionalProperties": False,
              "patternProperties": {"^(?!x)[a-z]+$": {"type": "integer"}}}
    norm = normalize_schema(schema)
    (key,) = norm["patternProperties"]
    assert "(?" not in key
    for value, ok in (({"ab": 1}, True), ({"xa": 1}, False), ({"ab": "s"}, False)):
        assert validator_class(norm)(norm).is_valid(value) == ok
        assert validator_class(schema)(schema).is_valid(value) == ok
    with pytest.raises(InvalidRequestError, match="at #/patternProperties"):
        normalize_schema({"type": "object", "patternProperties": {"^(?=x)[a-z]+$": {}}})

"""Two patterns met in one regex (one a start-anchored prefix of a few literal strings): the met
regex must fully match exactly the strings that fully match the other pattern and start with
one of the prefixes. Property-style over sampled strings, then through the normalizer (allOf of
a format and a prefix pattern) and xgrammar."""
from __future__ import annotations

import json
import re

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.pattern_meet import meet_patterns
from sgdsl.runtime.grammar.schema.patterns import Unfoldable
from sgdsl.runtime.grammar.schema.strings import FORMAT_PATTERNS

from ..regex_sampling import candidates

# (the anchored pattern, the prefix pattern)
MEETS = [
    (FORMAT_PATTERNS["uri"], "^https?://"),
    ("^[a-z]+(-[a-z]+)*$", "^ab"),
    ("^(ab|cd)*x$", "^abc"),
    ("^a{2,5}$", "^aaa"),
    ("^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", "^(x|y-)"),
    (r"^\d{3}-\d+$", "^12"),
    ("^[^/]+/[a-z]?$", r"^a\.b"),
]


@pytest.mark.parametrize("full,prefix", MEETS)
def test_met_pattern_is_both(full, prefix):
    met = meet_patterns(full, prefix)
    assert met is not None and meet_patterns(prefix, full) == met
    both = only_full = 0
    for s in candidates(full, met, 8, seed=len(full)):
        want = bool(re.fullmatch(full, s)) and bool(re.match(prefix, s))
        assert bool(re.fullmatch(met, s)) == want, (full, prefix, met, s)
        both += want
        only_full += bool(re.fullmatch(full, s)) and not want
    assert both >= 3 and only_full >= 1  # both kinds of strings were compared


def test_no_common_string_gives_none():
    assert meet_patterns("^[0-9]+$", "^x") is None
    assert meet_patterns("^a{2}$", "^aaa") is None


@pytest.mark.parametrize("a,b", [
    ("^[a-z]+$", "^[a-z]"),  # a class: not a few literal strings
    ("^[a-z]+$", "^a+"),  # unbounded
    ("^[a-z]+$", "^a$"),  # anchored at both ends: not a prefix
    ("[a-z]+", "^a"),  # the other not anchored: searching it differs from matching it
    ("^a$|^b$", "^a"),
])
def test_other_pattern_pairs_are_refused(a, b):
    with pytest.raises(Unfoldable):
        meet_patterns(a, b)


def test_format_and_prefix_pattern_meet_through_the_normalizer():
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    schema = {"type": "string", "allOf": [{"format": "uri"}, {"pattern": "^https?://"}]}
    norm = normalize_schema(schema, "xgrammar")
    assert "allOf" not in json.dumps(norm)
    same = normalize_schema({"type": "string", "format": "uri", "pattern": "^https?://"})
    assert same["pattern"] == norm["pattern"]
    grammar = Grammar.from_json_schema(json.dumps(norm), any_whitespace=False)
    for s, ok in (("https://a.org/x?y=1", True), ("http://b", True), ("ftp://a.org", False),
                  ("https:/a", False), ("urn:isbn:1", False), ("https://a b", False)):
        assert _is_grammar_accept_string(grammar, json.dumps(s)) == ok, s


def test_unmeetable_patterns_are_rejected_naming_pattern():
    with pytest.raises(InvalidRequestError, match="'pattern' at #"):
        normalize_schema({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]})
    with pytest.raises(InvalidRequestError, match="no instance"):
        normalize_schema({"allOf": [{"type": "string", "pattern": "^a"},
                                    {"pattern": "^b[a-z]*$"}]})

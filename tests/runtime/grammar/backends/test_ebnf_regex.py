"""GBNF -> regex lowering for regex-only backends."""
from __future__ import annotations

import re

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.backends.ebnf_regex import ebnf_to_regex

CASES = [
    ('root ::= "a" | "b"', ["a", "b"], ["", "ab"]),
    ('root ::= num ("," num)*\nnum ::= [0-9]+  # digits', ["1", "1,22,333"], ["1,", ",1"]),
    ('root ::= [^"\\\\]{2,3} "." ', ["ab.", "xyz."], ["a.", 'a".']),
    ("root ::= 'x'? [a-c\\-] .", ["a!", "x-\n"], ["xx"]),
    ('root ::= "(" ")" "[" "]" "*" "\\n" "\\x41"', ["()[]*\nA"], ["()"]),
    ('root ::= item{2}\nitem ::= ("ab" | [0-9])', ["ab1", "12", "abab"], ["1", "123"]),
    ('root ::=\n  "k"\n  "=" [a-z]{1,}\n', ["k=a", "k=abc"], ["k="]),
]


@pytest.mark.parametrize("grammar,good,bad", CASES)
def test_language_is_preserved(grammar, good, bad):
    rx = ebnf_to_regex(grammar)
    for s in good:
        assert re.fullmatch(rx, s, flags=re.S), (rx, s)
    for s in bad:
        assert not re.fullmatch(rx, s, flags=re.S), (rx, s)


@pytest.mark.parametrize("grammar,match", [
    ('root ::= "(" root ")" | "x"', "recursive"),
    ('root ::= a\na ::= "(" b ")"\nb ::= a | "x"', "recursive"),
    ('root ::= missing', "undefined"),
    ('start ::= "x"', "no 'root'"),
    ('root ::= "unterminated', "unterminated"),
    ('root ::= "x"\nroot ::= "y"', "defined twice"),
    ('root ::= [a-', "unterminated"),
])
def test_errors(grammar, match):
    with pytest.raises(InvalidRequestError, match=match) as e:
        ebnf_to_regex(grammar)
    assert e.value.field == "ebnf"

"""Length bounds folded into a pattern: the folded regex must fully match exactly the strings
that fully match the pattern and have an allowed length. Checked property-style over strings
sampled from the pattern (with repeat counts reaching past the bounds), from the folded regex,
and mutations of both; then end to end through the normalizer and xgrammar."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.lengths import GRAMMAR_MAX, LENGTH_MARK
from sgdsl.runtime.grammar.schema.pattern_length import fold_lengths
from sgdsl.runtime.grammar.schema.patterns import Unfoldable

from ..regex_sampling import candidates as _candidates

# (pattern, minLength, maxLength)
FOLDABLE = [
    ("^[a-z][a-z0-9-]*$", 0, 63),
    ("^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", 0, 15),  # k8s names
    ("^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", 3, 6),
    ("^([Hh][Tt][Tt][Pp][Ss]?)://.+$", 0, 20),
    ("^[a-z0-9-~][a-z0-9-._~]*$", 2, 9),
    ("^[0-9]*$", 0, 9),
    (r"^\d{3}-\d+$", 5, 8),
    ("^a(b|c)+$", 0, 4),
    ("^(ab|cd)+x?$", 4, 9),  # an unbounded repeat of a fixed-width alternation
    ("^(ab|c)(d|ef){1,2}$", 3, 4),  # bounded repeats of variable-width groups multiply out
    ("^[A-Z]{2,4}[0-9]*$", 3, 5),
    ("^(?:x|yy)z*$", 2, 3),
    ("ab|cd+", 3, 5),  # unanchored: the backends match the whole string anyway
    (r"^\.[^\\/:*]{1,5}$", 2, 4),
    ("^[a-z]*$", 2, None),
    ("^x{2}(ab)*$", 1, 7),
]
UNFOLDABLE = [
    ("^(\\d+\\.\\d+\\.\\d+.*)$", 0, 32),  # several unbounded repeats share the length
    ("^([a-z]{2}|[a-z]-[a-z]+)(-[a-z]{1,8})*$", 0, 20),  # unbounded variable-width group
    ("^[a-z]{1,32}(\\.[a-z]{1,32}){1,3}$", 0, 50),  # the sum of four counts
    ("^(ab|cde)+$", 0, 9),  # the same, a variable-width group
    ("^((?!cl).)*$", 0, 80),  # lookaround
    ("^(a)\\1*$", 0, 4),  # backreference
    ("^a\\b.*$", 0, 4),
    ("^[]a]*$", 0, 4),  # ']' first in a class: dialects differ
    ("^a{,3}b*$", 0, 4),
    ("^(?P<n>a)b*$", 0, 4),
    ("^a*$b", 0, 4),
]
def _wanted(pattern: str, lo: int, hi: int | None, s: str) -> bool:
    return bool(re.fullmatch(pattern, s)) and lo <= len(s) and (hi is None or len(s) <= hi)


@pytest.mark.parametrize("pattern,lo,hi", FOLDABLE)
def test_folded_pattern_is_pattern_and_length(pattern, lo, hi):
    folded = fold_lengths(pattern, lo, hi)
    assert folded is not None
    reach = (hi if hi is not None else lo) + 4
    cut_by_length = kept = 0
    for s in _candidates(pattern, folded, reach, seed=len(pattern) * 31 + lo):
        want = _wanted(pattern, lo, hi, s)
        assert bool(re.fullmatch(folded, s)) == want, (pattern, lo, hi, folded, s)
        kept += want
        cut_by_length += bool(re.fullmatch(pattern, s)) and not want
    assert kept >= 3  # the comparison saw both kinds of strings (else it proves nothing)
    assert cut_by_length >= 3 or folded == pattern


@pytest.mark.parametrize("pattern,lo,hi", FOLDABLE[:8])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_folded_pattern_agrees_on_generated_matches(pattern, lo, hi, data):
    folded = fold_lengths(pattern, lo, hi)
    s = data.draw(st.one_of(st.from_regex(pattern, fullmatch=True),
                            st.from_regex(folded, fullmatch=True)))
    assert bool(re.fullmatch(folded, s)) == _wanted(pattern, lo, hi, s), (folded, s)


def test_folding_keeps_what_needs_no_folding_and_spells_the_rest_compactly():
    assert fold_lengths("^[a-z]+$", 1, None) == "^[a-z]+$"
    # (not sampled above: Python's backtracking takes minutes on such nested repeats)
    assert fold_lengths("^(([a-zA-Z0-9]+)(-?))+$", 1, None) == "^(([a-zA-Z0-9]+)(-?))+$"
    assert fold_lengths("^[0-9]{5}$", 0, 10) == "^[0-9]{5}$"
    assert fold_lengths("^[a-z]+$", 0, 3) == "^[a-z]{1,3}$"
    assert fold_lengths("^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", 0, 15) == \
        "^([a-z0-9]|[a-z0-9][a-z0-9-]{0,13}[a-z0-9])$"


def test_no_string_of_allowed_length_gives_none():
    assert fold_lengths("^[0-9]{5}$", 6, None) is None
    assert fold_lengths("^ab|cd$", 3, 3) is None
    assert fold_lengths("^(ab|cde)$", 3, None) == "^cde$"


@pytest.mark.parametrize("pattern,lo,hi", UNFOLDABLE)
def test_unfoldable_patterns_are_refused(pattern, lo, hi):
    with pytest.raises(Unfoldable):
        fold_lengths(pattern, lo, hi)


@pytest.mark.parametrize("pattern,lo,hi", UNFOLDABLE[:3])
def test_unfoldable_bounds_go_to_the_runtime_or_are_rejected_naming_them(pattern, lo, hi):
    """Alone, the bounds are counted at runtime (schema/lengths.py); beside another string
    branch they cannot be, and the rejection names them."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern,
                                                     "maxLength": hi}}}
    out = normalize_schema(schema)["properties"]["s"]
    assert out["x-sgdsl-length"] == [0, hi] and "maxLength" not in out
    shared = {"type": "object", "properties": {"s": {"anyOf": [
        schema["properties"]["s"], {"type": "string", "enum": ["q"]}]}}}
    with pytest.raises(InvalidRequestError) as e:
        normalize_schema(shared)
    assert "'maxLength' at #/properties/s" in str(e.value)


def test_lookarounds_are_rejected_even_without_bounds():
    # xgrammar ignores lookaheads: "^(?!clyde).*$" would let "clyde" through (the idioms
    # lookaround.py spells exactly, like "^((?!(c|C)lyde).)*$", are tested in test_lookaround)
    for pattern in ("^((?!aa).)*$", "^(?=a)[ab]$", "^a(?<!b)$"):
        with pytest.raises(InvalidRequestError, match="'pattern' at #"):
            normalize_schema({"type": "string", "pattern": pattern})
    assert normalize_schema({"type": "string", "pattern": "^[(?!]+$"})  # a class, not a group


def test_impossible_bounds_make_the_schema_impossible():
    with pytest.raises(InvalidRequestError, match="no instance"):
        normalize_schema({"type": "string", "pattern": "^[0-9]{5}$", "minLength": 6})
    out = normalize_schema({"anyOf": [{"type": "string", "pattern": "^[0-9]{5}$",
                                       "minLength": 6}, {"type": "integer"}]})
    assert out == {"type": "integer"}


@pytest.mark.parametrize("pattern,lo,hi", [c for c in FOLDABLE if "\\" not in c[0]])
def test_xgrammar_enforces_the_folded_pattern(pattern, lo, hi):
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    schema = {"type": "string", "pattern": pattern, "minLength": lo}
    if hi is not None:
        schema["maxLength"] = hi
    norm = normalize_schema(schema, "xgrammar")
    assert "maxLength" not in norm and "minLength" not in norm
    grammar = Grammar.from_json_schema(json.dumps(norm), any_whitespace=False)
    folded = norm["pattern"]
    reach = (hi if hi is not None else lo) + 3
    # JSON escapes (quotes, backslashes, control characters) are the backend's business
    plain = sorted(s for s in _candidates(pattern, folded, reach, seed=7)
                   if all(" " <= c < "\x7f" and c not in '"\\' for c in s))[:150]
    for s in plain:
        assert _is_grammar_accept_string(grammar, json.dumps(s)) == _wanted(pattern, lo, hi, s), s


SUITE = Path(__file__).parents[3] / "data" / "schemas" / "realworld"


@pytest.mark.parametrize("name,prop,longest", [
    ("hand__k8s_container_port", "name", 15), ("hand__package_json_fragment", "name", 214)])
def test_suite_schemas_with_folded_bounds_compile_and_hold(name, prop, longest):
    """A bound that folds into small counts lives in the grammar; one that would fold into
    counts past GRAMMAR_MAX (214 here) is counted by the runtime, the pattern as written."""
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    norm = normalize_schema(json.loads((SUITE / f"{name}.json").read_text()), "xgrammar")
    sub = (norm["anyOf"][0] if "anyOf" in norm else norm)["properties"][prop]
    if "$ref" in sub:  # a pattern string used more than once is shared (schema/sharing.py)
        sub = norm["$defs"][sub["$ref"].rsplit("/", 1)[1]]
    assert "maxLength" not in sub
    if longest > GRAMMAR_MAX:
        assert sub[LENGTH_MARK][1] == longest
        return
    assert LENGTH_MARK not in sub
    grammar = Grammar.from_json_schema(json.dumps({**sub, "type": "string"}),
                                       any_whitespace=False)
    for n, ok in ((longest, True), (longest + 1, False), (1, True)):
        assert _is_grammar_accept_string(grammar, json.dumps("a" * n)) == ok, n


def test_length_bound_on_a_format_pattern_that_already_fits_is_dropped():
    norm = normalize_schema({"type": "string", "format": "uri", "minLength": 1})
    assert "minLength" not in norm and norm["pattern"].startswith("^[A-Za-z]")

"""uniqueItems over items of a finite domain (issue 15): a pattern with few matches (``^[ab]$``),
an enum, an integer range, anyOf of those, with minItems/maxItems near the domain's size and
under an object property. The normalizer expands a small domain into an enum of arrays, rejects
minItems above its size naming uniqueItems, and hands a larger one to the runtime as the items'
enum (``schema/arrays.py``); the guard never opens an item it cannot finish distinctly nor
follows a string only a used value finishes (``item_domain.py``). Random walks on both backends
must end valid under the original schema: before, 7 in 12 walks over ``^[ab]$`` with minItems 2
ended with a duplicate."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.guards.item_domain import Domain, IntRange
from sgdsl.runtime.grammar.guards.json_track import JsonTrack
from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.arrays import UNIQUE_MARK, canonical
from sgdsl.runtime.grammar.schema.pattern_values import pattern_values
from sgdsl.runtime.grammar.guards.unique_keys import UniqueKeyGrammar

from ..helpers import EOS, allowed_ids, feed_text, guarded, spaced

AB = {"type": "string", "pattern": "^[ab]$"}
LETTERS = {"type": "string", "pattern": "^[a-i]$"}  # 9 values: 2**9 arrays, too many to list
PREFIXED = {"type": "string", "pattern": "^(x|xy|xyz|yy|y|ab|abc|q|qq|qqq)$"}


def _array(items: dict, **bounds) -> dict:
    return {"type": "array", "items": items, "uniqueItems": True, **bounds}


WALKED = {
    "ab": _array(AB),
    "ab min 2": _array(AB, minItems=2),
    "ab max 2": _array(AB, maxItems=2),
    "x|yy|z min 2": _array({"type": "string", "pattern": "^(x|yy|z)$"}, minItems=2),
    "0..2 min 2": _array({"type": "integer", "minimum": 0, "maximum": 2}, minItems=2),
    "in an object": {"type": "object", "required": ["tags"], "additionalProperties": False,
                     "properties": {"tags": _array(AB, minItems=2)}},
    "letters": _array(LETTERS),
    "letters min 8": _array(LETTERS, minItems=8),
    "prefixed min 6": _array(PREFIXED, minItems=6),
    "0..9 min 7": _array({"type": "integer", "minimum": 0, "maximum": 9}, minItems=7),
    "0..9 min 3": _array({"type": "integer", "minimum": 0, "maximum": 9}, minItems=3),
    "95..110 min 3": _array({"type": "integer", "minimum": 95, "maximum": 110}, minItems=3),
    "enum of 15": _array({"enum": list("abcdefghijk") + [1, 2.5, True, None]}, minItems=4),
    "anyOf": _array({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 4},
                               {"type": "string", "pattern": "^[ab]{1,2}$"}]}, minItems=5),
}


def test_pattern_values_lists_whole_matches():
    assert pattern_values("^[ab]$", 8) == ["a", "b"]
    assert pattern_values("^a|^b$", 8) == ["a", "b"]
    assert pattern_values(r"^(?:ab){1,2}c?$", 8) == ["ab", "abc", "abab", "ababc"]
    assert pattern_values(r"^\d$", 10) == [str(d) for d in range(10)]
    for wide in ("^.$", "^[^a]$", r"^\w$", "^a+$", "^[a-z]{2}$", "^(?i)a$"):
        assert pattern_values(wide, 256) is None, wide


def test_small_domains_become_enums_of_arrays():
    assert normalize_schema(_array(AB, minItems=2)) == {"enum": [["a", "b"]]}
    ints = normalize_schema(_array({"type": "integer", "minimum": 0, "maximum": 2}, minItems=2))
    assert ints["enum"] == [[0, 1], [0, 2], [1, 2], [0, 1, 2]]
    equal = normalize_schema(_array({"enum": [1, 1.0, True, "a"]}, minItems=3))
    assert equal == {"enum": [[1, True, "a"]]}  # 1.0 is 1; true is not


def test_minitems_above_the_domain_is_rejected_naming_unique_items():
    for items in (AB, {"enum": ["a", "b"]}, {"type": "integer", "minimum": 0, "maximum": 999}):
        with pytest.raises(InvalidRequestError, match="uniqueItems with minItems"):
            normalize_schema(_array(items, minItems=1001 if "maximum" in items else 3))
    optional = {"type": "object", "properties": {"t": _array(AB, minItems=3)}}
    assert normalize_schema(optional) == {"type": "object", "additionalProperties": False}


def test_large_domains_go_to_the_runtime_as_enums():
    letters = normalize_schema(_array(LETTERS))
    assert letters[UNIQUE_MARK] is True and letters["items"] == {"enum": list("abcdefghi")}
    mixed = normalize_schema(WALKED["anyOf"])
    assert mixed["items"]["enum"] == [0, 1, 2, 3, 4, "a", "b", "aa", "ab", "ba", "bb"]
    digits = normalize_schema(WALKED["0..9 min 3"])
    assert digits["items"] == {"type": "integer", "minimum": 0, "maximum": 9}  # read as a range


def test_domain_fits_only_what_can_still_become_new():
    values = ["x", "xy", "yy", "z", 1, 1000, {"a": [1, "b c"]}]
    names, d = frozenset(["x", "yy"]), Domain(values)
    assert d.fits(b' "x', names) and not d.fits(b'"y', names) and d.fits(b'"y', frozenset())
    assert d.fits(b"", names) and not d.fits(b"", frozenset(map(canonical, values)))
    assert d.fits(b"1", frozenset([canonical(1)]))  # 1000 is left
    assert not d.fits(b"10", frozenset([canonical(1000)]))
    assert d.fits(b'{ "a" : [1, "b c', names) and not d.fits(b'{"a":[2', names)
    assert d.fits(b'"\\u0079', frozenset(["x"])) and not d.fits(b'"\\u0079', names)  # "y
    r = IntRange(95, 110)
    used = frozenset(canonical(v) for v in (100, 101, 102, 103, 104, 105, 106, 107, 108, 109))
    assert not r.fits(b"10", used) and r.fits(b"1", used) and r.fits(b"9", used)
    assert not IntRange(0, 2).fits(b"", frozenset(canonical(v) for v in (0, 1, 2)))
    assert not IntRange(0, 20).fits(b"-", frozenset())


def _marked(backend, quotes, values: list, **bounds) -> UniqueKeyGrammar:
    """A unique array of ``values`` as the runtime gets one too large to expand (the schema
    marked by hand: the normalizer would list a domain this small)."""
    schema = {"type": "array", "items": {"enum": values}, **bounds}
    key = GrammarKey.from_constraint("json_schema", json.dumps(schema))
    root = {**schema, UNIQUE_MARK: True}
    return UniqueKeyGrammar(backend.new_grammar(backend.compile(key)), quotes,
                            [JsonTrack(root=root)], None)


def _token(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_no_item_opens_once_the_domain_is_used_up(backend, quotes, tokenizer):
    g = _marked(backend, quotes, ["x", "yy", "z"])
    assert feed_text(g, tokenizer, spaced(backend, '["x","yy","z"'))
    comma, close = _token(tokenizer, ","), _token(tokenizer, "]")
    allowed = allowed_ids(g)
    assert comma not in allowed and close in allowed and not g.accept_token(comma)


def test_no_string_only_a_used_value_finishes(backend, quotes, tokenizer):
    g = _marked(backend, quotes, ["x", "yy", "z"], minItems=2)
    assert feed_text(g, tokenizer, spaced(backend, '["yy",') + '"')
    y, x = _token(tokenizer, "y"), _token(tokenizer, "x")
    allowed = allowed_ids(g)
    assert y not in allowed and x in allowed and not g.accept_token(y)


@pytest.mark.parametrize("name", list(WALKED))
def test_walks_end_valid(name, backend, quotes, walker):
    schema = WALKED[name]
    assert walker.valid_walks(lambda: guarded(backend, quotes, schema), schema,
                              random.Random(11), walks=10) >= 8


def _walk_long(g, tokenizer, quotes, rng: random.Random) -> str:
    """A random walk that closes the array only when nothing else is allowed (at most 200
    tokens)."""
    ids: list[int] = []
    for _ in range(200):
        allowed = allowed_ids(g)
        assert allowed, "no token allowed before the end"
        if EOS in allowed:
            assert g.accept_token(EOS)
            break
        going_on = [t for t in allowed if b"]" not in (quotes.bytes[t] or b"")]
        pick = rng.choice(going_on or allowed)
        assert g.accept_token(pick)
        ids.append(pick)
    return tokenizer.decode(ids)


@pytest.mark.parametrize("values", [["x", "yy", "z"], ["a", "ab", "b", 1, 12, None, True]],
                         ids=["strings", "mixed"])
def test_walks_use_the_domain_up_and_stop(values, backend, quotes, tokenizer):
    """Arrays without maxItems that close only when they must: each uses every value, then
    closes (no item opened with none left, none written that only a used value ends)."""
    schema = _array({"enum": values})
    rng = random.Random(5)
    for _ in range(6):
        items = json.loads(_walk_long(_marked(backend, quotes, values), tokenizer, quotes, rng))
        jsonschema.validate(items, schema)
        assert len(items) == len(values)

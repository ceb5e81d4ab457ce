"""The normalizer's rewrites keep every instance of the result an instance of the original
(checked with jsonschema over hand-picked instances, valid and invalid); exact rewrites keep the
invalid ones out and the valid ones in. What cannot be enforced is rejected naming keyword+path."""
from __future__ import annotations

import json

import jsonschema
import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.grammar.schema import OutputValidator, normalize_schema
from sgdsl.runtime.grammar.schema.emit import emit
from sgdsl.runtime.grammar.schema.oneof import disjoint, make_exclusive
from sgdsl.runtime.grammar.schema.strings import FORMAT_PATTERNS
from sgdsl.runtime.grammar.schema.validator import validator_class

OBJ_A = {"type": "object", "properties": {"a": {"type": "integer"}}}
# (name, schema, instances, exact): exact means the normal form accepts the same instances.
CASES = [
    ("siblings into anyOf", {"type": "object", "properties": {"name": {"type": "string"}},
                             "required": ["name"], "anyOf": [
                                 {"properties": {"x": {"type": "integer"}}, "required": ["x"]},
                                 {"properties": {"y": {"type": "integer"}}, "required": ["y"]}]},
     [{"name": "n", "x": 1}, {"x": 1}, {"name": "n"}, {"name": "n", "y": "s"}], True),
    ("closed object oneOf required", {
        "type": "object", "additionalProperties": False,
        "properties": {"pojo": {"type": "string"}, "json": {"type": "string"}},
        "oneOf": [{"required": ["pojo"]}, {"required": ["json"]}]},
     [{"pojo": "a"}, {"json": "b"}, {"pojo": "a", "json": "b"}, {}, {"zzz": "a"}], True),
    ("$ref siblings", {"$defs": {"a": OBJ_A}, "$ref": "#/$defs/a", "required": ["a"]},
     [{"a": 1}, {}, {"a": "s"}], True),
    ("draft-04 definitions and exclusive flags", {
        "definitions": {"n": {"type": "integer", "minimum": 0, "exclusiveMinimum": True,
                              "maximum": 5, "exclusiveMaximum": False}},
        "$ref": "#/definitions/n"}, [0, 1, 5, 6, -1], True),
    ("draft-04 tuple items", {"type": "array", "items": [{"type": "integer"},
                                                         {"type": "string"}],
                              "additionalItems": False}, [[1, "a"], [1, 2], [1, "a", 3], [1]],
     True),
    ("allOf merge", {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}},
         "required": ["a"]},
        {"properties": {"a": {"maximum": 5}, "b": {"type": "string"}}, "required": ["b"]}]},
     [{"a": 1, "b": "s"}, {"a": 6, "b": "s"}, {"a": 1}, {"b": "s"}, {"a": -1, "b": "x"}], True),
    ("allOf closed", {"allOf": [{"type": "object", "additionalProperties": False,
                                 "properties": {"a": {"type": "integer"}}},
                                {"properties": {"b": {"type": "integer"}}}]},
     [{"a": 1}, {"b": 1}, {}, {"a": "x"}], True),
    ("allOf enums", {"allOf": [{"enum": ["a", "b", 1]}, {"type": "string"}]},
     ["a", "b", 1, "c"], True),
    ("if/then on enum", {"type": "object", "properties": {"kind": {"enum": ["x", "y"]},
                                                          "b": {"type": "integer"}},
                         "if": {"properties": {"kind": {"const": "x"}}},
                         "then": {"required": ["b"]}, "else": {"required": ["kind"]}},
     [{"kind": "x", "b": 1}, {"kind": "x"}, {"kind": "y"}, {"b": 1}, {}, {"kind": "y", "b": 2}],
     True),
    ("if/then not negatable", {"type": "object", "properties": {"c": {"type": "string"},
                                                                "z": {"type": "string"}},
                               "if": {"properties": {"c": {"const": "US"}}},
                               "then": {"required": ["z"]}},
     [{"c": "US", "z": "1"}, {"c": "US"}, {"c": "FR"}, {"c": "FR", "z": "2"}], False),
    ("allOf of if/then on a discriminator", {
        "type": "object", "properties": {"type": {"enum": ["a", "b", "c"]}}, "required": ["type"],
        "allOf": [{"if": {"properties": {"type": {"const": t}}},
                   "then": {"properties": {"type": {"const": t}, k: {"type": "string"}},
                            "required": [k], "additionalProperties": False}}
                  for t, k in (("a", "name"), ("b", "pk"))]},
     [{"type": "a", "name": "x"}, {"type": "b", "pk": "x"}, {"type": "c"}, {"type": "a"},
      {"type": "b", "name": "x"}, {"type": "c", "zz": 1}], True),
    ("dependencies", {"$schema": "http://json-schema.org/draft-07/schema#",
                      "type": "object", "properties": {"a": {"type": "integer"},
                                                       "b": {"type": "integer"}},
                      "dependencies": {"a": ["b"]}},
     [{"a": 1, "b": 2}, {"a": 1}, {"b": 2}, {}], True),
    ("dependentSchemas", {"type": "object", "additionalProperties": False,
                          "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "dependentSchemas": {"a": {"properties": {"b": {"minimum": 3}},
                                                     "required": ["b"]}}},
     [{"a": 1, "b": 3}, {"a": 1, "b": 2}, {"a": 1}, {"b": 0}, {}], True),
    ("not enum", {"type": "object", "properties": {"k": {"enum": ["a", "b", "c"]}},
                  "required": ["k"], "not": {"properties": {"k": {"enum": ["a"]}}}},
     [{"k": "a"}, {"k": "b"}, {"k": "c"}], True),
    ("pattern and length", {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
     ["abc", "abcd", "", "ab1"], True),
    ("pattern within bounds", {"type": "string", "pattern": "^[0-9]{5}$", "maxLength": 10},
     ["12345", "1234"], True),
    ("uniqueItems small domain", {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                  "uniqueItems": True, "minItems": 1},
     [["a"], ["b", "a"], ["a", "a"], [], ["a", "b", "c"]], False),
    ("uniqueItems at most one", {"type": "array", "items": {"type": "string"},
                                 "uniqueItems": True, "maxItems": 1}, [["a"], [], ["a", "b"]],
     True),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}},
     [[3], [3, 1], [1, 3], [1], []], False),
    ("integer bounds fractional", {"type": "integer", "minimum": 1.5, "exclusiveMaximum": 10},
     [1, 2, 9, 10], True),
    ("oneOf types", {"oneOf": [{"type": "string"}, {"type": "integer"}]}, ["a", 1, None], True),
    ("enum filtered by type", {"type": "string", "enum": ["a", 1, None]}, ["a", 1, None], True),
    ("recursive $ref", {"type": "object", "properties": {"v": {"type": "integer"},
                                                         "next": {"$ref": "#"}},
                        "required": ["v"]},
     [{"v": 1}, {"v": 1, "next": {"v": 2}}, {"v": 1, "next": {}}, {}], True),
    ("recursive $ref with siblings", {
        "$defs": {"n": {"type": "object", "properties": {
            "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/n", "required": ["v"]}}},
     [{"root": {"v": 1}}, {"root": {}}, {"root": {"v": 1, "kids": [{}]}}, {"root": {"kids": []}}],
     True),
    ("impossible anyOf branch dropped", {"anyOf": [{"type": "string"}, False,
                                                   {"allOf": [{"type": "integer"},
                                                              {"type": "string"}]}]},
     ["a", 1], True),
    ("unknown keywords are ignored", {"type": "object", "properties": {"m": {
        "port": {"type": "number"}, "x-vendor": 1}}}, [{"m": 1}, {"m": "s"}, {}], True),
    ("false property", {"type": "object", "properties": {"a": False, "b": {"type": "integer"}}},
     [{"b": 1}, {"a": 1}], False),
    ("oneOf overlapping enums", {"oneOf": [{"enum": ["red", "orange", 6, None]},
                                           {"enum": ["blue", "orange", 6.0, 3]}]},
     ["red", "orange", 6, None, "blue", 3, "x"], True),
    ("oneOf optional discriminator", {
        "type": "object", "properties": {"shape": {"type": "string"}, "r": {"type": "number"}},
        "oneOf": [{"properties": {"shape": {"const": "circle"}}},
                  {"properties": {"shape": {"const": "square"}}}]},
     [{"shape": "circle"}, {"shape": "square", "r": 1}, {}, {"r": 1}, {"shape": "tri"}], True),
    ("oneOf open objects", {"type": "object", "properties": {"a": {"type": "integer"},
                                                             "b": {"type": "integer"}},
                            "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
     [{"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {}, {"a": 1, "c": 2}], False),
    ("oneOf forbidding a key, then merged", {"allOf": [  # a later sibling may still add keys
        {"oneOf": [{"required": ["a"], "properties": {"a": {"type": "integer"}}},
                   {"required": ["b"], "properties": {"b": {"type": "integer"}}}]},
        {"type": "object", "required": ["c"], "properties": {"c": {"type": "string"}}}]},
     [{"a": 1, "c": "x"}, {"b": 1, "c": "x"}, {"a": 1, "b": 2, "c": "x"}, {"a": 1}], True),
    ("oneOf forbidden keys", {"type": "object", "properties": {
        "r": {"type": "number"}, "w": {"type": "number"}, "h": {"type": "number"}},
        "oneOf": [{"properties": {"w": False}, "required": ["r"]},
                  {"properties": {"h": False}, "required": ["r"]}]},
     [{"r": 1}, {"r": 1, "h": 1}, {"r": 1, "w": 1}, {"r": 1, "w": 1, "h": 1}], False),
    ("oneOf anchored patterns", {"oneOf": [{"type": "string", "pattern": "^[a-z]+$"},
                                           {"pattern": "^~"}]}, ["ab", "~x", "A", "", 5], False),
    ("oneOf array lengths and ranges", {"type": "object", "properties": {"x": {"oneOf": [
        {"type": "array", "maxItems": 1}, {"type": "array", "minItems": 2}]}, "n": {"oneOf": [
            {"type": "number", "exclusiveMaximum": 0}, {"type": "integer", "minimum": 0}]}}},
     [{"x": []}, {"x": [1, 2]}, {"n": -0.5}, {"n": 0}, {"n": 0.5}], True),
    ("untyped keywords get their types", {"type": "object", "properties": {
        "ip": {"format": "ipv4"}, "n": {"minimum": 3}, "both": {"minLength": 2, "maximum": 1}}},
     [{"ip": "1.2.3.4"}, {"ip": "backend"}, {"ip": 28}, {"n": 3}, {"n": 2}, {"n": "x"},
      {"both": "ab"}, {"both": 1}, {"both": "a"}, {"both": 2}], False),
]


def _valid(schema, value) -> bool:
    return validator_class(schema)(schema).is_valid(value)


@pytest.mark.parametrize("name,schema,instances,exact", CASES, ids=[c[0] for c in CASES])
def test_normal_form_accepts_only_instances_of_the_original(name, schema, instances, exact):
    norm = normalize_schema(schema, "xgrammar")
    text = json.dumps(norm)
    for word in ("allOf", "oneOf", '"if"', '"not"', "dependen", "uniqueItems", "contains",
                 "definitions", "exclusiveMinimum\": true"):
        assert word not in text, (word, text)
    for value in instances:
        if _valid(norm, value):
            assert _valid(schema, value), (value, norm)
        elif exact:
            assert not _valid(schema, value), (value, norm)


def test_oneof_exclusive_branches_are_rewritten_exactly():
    schema = CASES[1][1]
    norm = normalize_schema(schema)
    assert not _valid(norm, {"pojo": "a", "json": "b"})  # both branches: oneOf says no
    assert _valid(norm, {"pojo": "a"}) and _valid(norm, {"json": "b"})


@pytest.mark.parametrize("fmt", sorted(FORMAT_PATTERNS))
def test_format_patterns_only_match_valid_values(fmt):
    samples = {"date": ["2024-02-28", "2024-13-01", "2024-02-30", "24-01-01"],
               "time": ["10:00:00Z", "23:59:59.5+01:00", "24:00:00Z", "10:00"],
               "date-time": ["2024-01-31T10:00:00Z", "2024-01-31 10:00:00Z", "2024-01-31"],
               "email": ["a.b@c.org", "a@b", "@b.com", "a..b@c.com"],
               "uri": ["https://a.com/x?y=1", "urn:isbn:123", "not a uri", "/rel"],
               "uuid": ["123e4567-e89b-12d3-a456-426614174000", "123e4567"],
               "ipv4": ["1.2.3.4", "255.255.255.255", "1.2.3.256", "01.2.3.4"],
               "ipv6": ["2001:db8:0:0:0:0:0:1", "1.2.3.4", "2001:db8::1::2"]}[fmt]
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    schema = {"type": "string", "format": fmt}
    norm = normalize_schema(schema)
    assert "format" not in norm
    hits = 0
    for s in samples:
        if _valid(norm, s):
            hits += 1
            assert checker.conforms(s, fmt), (fmt, s)
    assert hits >= 1


@pytest.mark.parametrize("schema,keyword,path", [
    # NOTE: alone, such bounds are counted at runtime (schema/lengths.py); beside another
    # string branch they cannot be
    ({"properties": {"s": {"anyOf": [{"type": "string", "pattern": "^a(b|cd)+$", "maxLength": 4},
                                     {"type": "string", "pattern": "^q+$"}]}}},
     "maxLength", "#/properties/s/anyOf/0"),
    ({"type": "integer", "not": {"type": "integer", "minimum": 3}}, "not", "#"),
    ({"$ref": "https://example.com/s.json"}, "$ref", "#"),
    ({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}, "pattern", "#"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 1},
      "maxContains": 2}, "contains", "#"),
])
def test_unenforceable_keyword_is_rejected_naming_keyword_and_path(schema, keyword, path):
    with pytest.raises(InvalidRequestError) as e:
        normalize_schema(schema, "xgrammar")
    assert e.value.field == "json_schema"
    assert f"'{keyword}' at {path}" in str(e.value), str(e.value)


def test_schema_without_instance_is_rejected():
    with pytest.raises(InvalidRequestError, match="no instance"):
        normalize_schema({"allOf": [{"type": "string"}, {"type": "integer"}]})
    with pytest.raises(InvalidRequestError, match="no instance"):
        normalize_schema({"type": "object", "required": ["a"], "properties": {"a": False}})


def test_outlines_keeps_its_bound_limit_and_xgrammar_does_not():
    """Where the grammar keeps a bound (beside another string branch): counted at runtime
    elsewhere (schema/lengths.py), on both backends."""
    big = {"type": "object", "properties": {"bio": {"anyOf": [
        {"type": "string", "maxLength": 5000}, {"type": "string", "pattern": "^x+$"}]}}}
    assert normalize_schema(big, "xgrammar") == big
    with pytest.raises(InvalidRequestError, match="maxLength.*#/properties/bio"):
        normalize_schema(big, "outlines")
    alone = {"type": "object", "properties": {"bio": {"type": "string", "maxLength": 5000}}}
    for backend in ("xgrammar", "outlines"):
        marked = normalize_schema(alone, backend)["properties"]["bio"]
        assert marked == {"type": "string", "x-sgdsl-length": [0, 5000]}


def test_small_string_bounds_become_fast_patterns_for_xgrammar():
    schema = {"type": "string", "minLength": 2, "maxLength": 12}
    fast = normalize_schema(schema, "xgrammar")
    assert set(fast) == {"type", "pattern"}
    for value in ("ab", "héllo wörld", "a", "x" * 13, 'a"b', "a\nb"):
        if _valid(fast, value):
            assert _valid(schema, value)
    assert _valid(fast, "héllo wörld") and not _valid(fast, 'a"b')
    assert normalize_schema(schema, "outlines") == schema  # its own regex trick applies


def test_small_integer_ranges_become_enums_for_outlines():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                     "exclusiveMaximum": 4}}}
    norm = normalize_schema(schema, "outlines")  # outlines ignores minimum/maximum
    assert norm["properties"]["n"] == {"enum": [1, 2, 3]}
    # a wider range stays as it is: the outlines backend splices in a range regex
    wide = {"type": "integer", "minimum": 0, "maximum": 1000}
    assert normalize_schema(wide, "outlines") == wide
    # a format outlines-core does not know is an annotation: dropped, not a compile error
    assert normalize_schema({"type": "string", "format": "uri-reference"}, "outlines") == \
        {"type": "string"}


def test_optional_groups_are_spelled_for_xgrammar():
    # xgrammar 0.2.8 reads "(\\.[0-9]+)?" wrongly (it accepted "a0b" below); {0,1} it reads right
    norm = normalize_schema({"type": "string", "pattern": r"^a(\.[0-9]+)?b\)?$"}, "xgrammar")
    assert norm["pattern"] == r"^a(\.[0-9]+){0,1}b\)?$"
    assert _valid(norm, "a.5b)") and not _valid(norm, "a0b")


def test_normalization_is_pure_and_deterministic():
    schema = CASES[0][1]
    before = json.dumps(schema, sort_keys=True)
    assert normalize_schema(schema) == normalize_schema(schema)
    assert json.dumps(schema, sort_keys=True) == before


def test_branch_product_is_bounded():
    many = {"allOf": [{"anyOf": [{"type": "object", "properties": {f"k{i}{j}": {"type": "integer"}},
                                  "required": [f"k{i}{j}"]} for j in range(3)]}
                      for i in range(5)]}  # 3**5 alternatives
    with pytest.raises(InvalidRequestError, match="alternatives"):
        normalize_schema(many)


def test_overlapping_oneof_is_left_to_the_output_check():
    # "an integer that is not a number" has no spelling: the grammar gets anyOf, the output
    # check (the backstop) reports 1 as a violation
    branches, exclusive = make_exclusive([{"type": "integer"}, {"type": "number"}])
    assert not exclusive
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    assert branches == [{"type": "integer"}, {"type": "number"}]
    # the union the grammar gets: the integer branch lies inside the number one (subsume.py)
    assert normalize_schema(schema) == {"type": "number"}
    assert "oneOf" in OutputValidator().violation(json.dumps(schema), "1")
    assert OutputValidator().violation(json.dumps(schema), "1.5") is None


def test_undeclared_draft04_schema_is_read_as_draft04():
    old = {"type": "integer", "minimum": 0, "exclusiveMinimum": True}
    assert validator_class(old) is jsonschema.Draft4Validator
    assert OutputValidator().violation(json.dumps(old), "0")
    assert normalize_schema(old) == {"type": "integer", "minimum": 1}


def test_output_validator_reports_violations_against_the_original():
    v = OutputValidator(cache_size=2)
    schema = json.dumps(CASES[1][1])
    assert v.violation(schema, '{"pojo": "a"}') is None
    why = v.violation(schema, '{"pojo": "a", "json": "b"}')
    assert why and "oneOf" in why
    assert "not valid JSON" in v.violation(schema, '{"pojo": ')
    assert v.violation("", "[1]") is None  # any JSON
    assert "format" in v.violation('{"type": "string", "format": "date"}', '"2024-02-30"')
    for i in range(3):
        v.violation(json.dumps({"const": i}), str(i))
    assert len(v._cache) == 2




def test_untyped_type_keywords_are_typed_after_merging():
    # xgrammar ignores a pattern/minimum on a node without "type" (the model wrote
    # "bindAddr": "backend-cole" for {"format": "ipv4"}): the emitted node names its types
    norm = normalize_schema({"anyOf": [{"format": "ipv4"}, {"minimum": 3}, {"maxItems": 2}]})
    assert [b["type"] for b in norm["anyOf"]] == ["string", "number", "array"]
    assert normalize_schema({"minLength": 1, "maxProperties": 2})["type"] == ["string", "object"]
    # typed only at the end: a vacuous string keyword beside an integer stays satisfiable
    merged = normalize_schema({"allOf": [{"minLength": 3}, {"type": "integer"}]})
    assert merged["type"] == "integer" and _valid(merged, 7)
    # no type-specific keyword: any value, as before
    assert "type" not in normalize_schema({"description": "d", "x-vendor": 1})


def test_untyped_format_is_enforced_by_the_backend(compiler, tokenizer):
    from sgdsl.runtime.grammar import GrammarKey

    from ..helpers import feed_text

    schema = {"type": "object", "properties": {"ip": {"format": "ipv4"}}, "required": ["ip"]}
    colon = ": " if compiler.backend.name == "xgrammar" else ":"  # outlines: compact JSON
    good = compiler.compile(GrammarKey.from_constraint("json_schema", schema))
    assert feed_text(good, tokenizer, f'{{"ip"{colon}"10.0.0.1"}}')
    bad = compiler.compile(GrammarKey.from_constraint("json_schema", schema))
    assert not feed_text(bad, tokenizer, f'{{"ip"{colon}"backend"}}')


def test_oneof_disjointness_reads_the_emitted_branch_against_the_original():
    # an untyped pattern is emitted as a string, but the original branch accepts any integer
    assert disjoint({"pattern": "^a"}, {"type": "integer"})
    assert not disjoint({"type": "integer"}, {"pattern": "^a"})
    # object rules need every shared instance to be an object
    closed = {"properties": {"a": {}}, "additionalProperties": False}  # any string too
    assert disjoint({"required": ["b"], "properties": {"b": {}}}, closed)
    assert not disjoint({"required": ["b"], "minLength": 1}, closed)  # a string fits both


@pytest.mark.parametrize("branches", [
    [{"enum": [1, 2]}, {"enum": [2, 3]}, {"type": "string"}],
    [{"type": "object", "properties": {"k": {"enum": ["x"]}, "v": {}}},
     {"type": "object", "properties": {"k": {"enum": ["y"]}, "v": {"type": "string"}}}],
    [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
     {"properties": {"b": {"type": "integer"}}, "required": ["b"]}],
    [{"type": "object", "properties": {"a": False, "b": {}}},
     {"type": "object", "properties": {"a": {}, "b": False}}],
])
def test_narrowed_oneof_branches_are_subsets_excluding_the_others(branches):
    out, exclusive = make_exclusive(branches)
    assert exclusive
    values = [1, 2, 3, "s", {}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"k": "x"},
              {"k": "y", "v": 1}, {"k": "y", "v": "s"}, {"k": "x", "v": 1}, {"a": 1, "c": 1}]
    for value in values:
        hits = [i for i, b in enumerate(branches) if _valid(b, value)]
        for narrowed in out:  # as emitted (an untyped branch gets its types there)
            if _valid(emit(narrowed, "#"), value):
                assert len(hits) == 1 and _valid(branches[hits[0]], value), (value, narrowed)


def test_anchored_patterns_with_different_first_characters_are_disjoint():
    from sgdsl.runtime.grammar.schema.pattern_start import first_chars

    assert first_chars(r"^(?:a|[b-d]+)x") == [(97, 97), (98, 100)]
    for unknown in ("abc", "^a*b", "(?i)^a", "^[^a]", r"^\d", "^(a|)"):
        assert first_chars(unknown) is None, unknown
    status = [{"type": "object", "required": ["status"],
               "properties": {"status": {"type": "string", "pattern": f"^{s}$"}}}
              for s in ("success", "fail", "error")]
    assert make_exclusive(status) == (status, True)
    uuid_or_var = [{"pattern": FORMAT_PATTERNS["uuid"]}, {"pattern": r"^\$[A-Z0-9-_]+"}]
    assert make_exclusive(uuid_or_var)[1]
    assert not make_exclusive([{"pattern": "^[a-f]"}, {"pattern": "^[e-z]"}])[1]

"""Repeated pattern strings share one ``$defs`` entry for xgrammar (``schema/sharing.py``):
the same instances, one compile per distinct pattern."""
from __future__ import annotations

import json

from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.sharing import share_patterns

CODE = {"type": "string", "pattern": "^[a-z]{2,5}$"}


def test_repeats_move_to_defs_and_singles_stay():
    root = {"type": "object", "properties": {
        "a": CODE, "b": CODE, "c": {"type": "array", "items": CODE},
        "d": {"type": "string", "pattern": "^x$"},
        "e": {"enum": [CODE, CODE]},  # data, not subschemas
        "f": {"type": "string", "pattern": "^x$", "x-sgdsl-length": [0, 300]}}}
    out = share_patterns(root)
    (name, shared), = out["$defs"].items()
    assert shared == CODE
    refs = [out["properties"][k] for k in "ab"] + [out["properties"]["c"]["items"]]
    assert refs == [{"$ref": f"#/$defs/{name}"}] * 3
    assert out["properties"]["d"] == root["properties"]["d"]
    assert out["properties"]["e"] == root["properties"]["e"]
    assert out["properties"]["f"] == root["properties"]["f"]  # runtime marks are never shared
    assert share_patterns({"type": "object", "properties": {"a": CODE}}) == \
        {"type": "object", "properties": {"a": CODE}}


def test_shared_schema_accepts_the_same_strings():
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string

    schema = {"type": "object", "properties": {k: {"type": "string", "maxLength": 100}
                                               for k in ("a", "b", "c")},
              "required": ["a", "b", "c"], "additionalProperties": False}
    norm = normalize_schema(schema, "xgrammar")
    assert len(norm["$defs"]) == 1 and json.dumps(norm).count("$ref") == 3
    grammar = Grammar.from_json_schema(json.dumps(norm), any_whitespace=False)
    for a, ok in (("x" * 100, True), ("x" * 101, False), ("", True)):
        text = json.dumps({"a": a, "b": "y", "c": "z"}, separators=(", ", ": "))
        assert _is_grammar_accept_string(grammar, text) == ok, (len(a), text[:40])

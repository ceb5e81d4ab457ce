"""What an xgrammar compile worker ships to the scheduler process (``XGrammarBackend.ship`` /
``receive``): the compile's source, compiled again there, never the serialized token-mask
tables (which cost several times the compile); a serialized grammar (an older disk-cache
file) still loads."""
from __future__ import annotations

import json

from sgdsl.runtime.grammar import GrammarKey

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
          "required": ["name", "tags"]}


def _accepts(backend, compiled, tokenizer, text: str) -> bool:
    grammar = backend.new_grammar(compiled)
    return grammar.accept_tokens(tokenizer.encode(text, add_special_tokens=False))


def test_ship_sends_the_source_and_receive_compiles_it(backends, tokenizer):
    backend = backends["xgrammar"]
    for key, good, bad in [
            (GrammarKey("json_schema", json.dumps(SCHEMA)), '{"name": "Ada", "tags": ["a"]}',
             '{"name": "Ada", "tags": ["c"]}'),
            (GrammarKey("regex", "[0-9]{2}-x"), "12-x", "1a"),
            (GrammarKey.choices(["yes", "no"]), "yes", "maybe")]:
        compiled = backend.compile(key)
        shipped = backend.ship(compiled)
        assert shipped[1:2] == b"[" and len(shipped) < len(backend.serialize(compiled))
        received = backend.receive(shipped)
        assert received.json == compiled.json and received.source == compiled.source
        assert _accepts(backend, received, tokenizer, good)
        assert not _accepts(backend, received, tokenizer, bad)
        assert backend.compiled_bytes(received, shipped) > len(shipped)


def test_a_serialized_grammar_still_loads(backends, tokenizer):
    backend = backends["xgrammar"]
    compiled = backend.compile(GrammarKey("json_schema", json.dumps(SCHEMA)))
    loaded = backend.receive(backend.serialize(compiled))
    assert loaded.source is None and loaded.json
    assert _accepts(backend, loaded, tokenizer, '{"name": "Bo", "tags": []}')
    assert backend.receive(backend.ship(loaded)).json  # shipped again as it came

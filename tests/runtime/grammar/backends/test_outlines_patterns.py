"""String patterns for outlines-core run over JSON text (``outlines_patterns.py``): a ``.`` or a
negated class must not match a quote, so no output leaves its string."""
from __future__ import annotations

import json
import random

import jsonschema

from sgdsl.runtime.grammar import GrammarKey
from sgdsl.runtime.grammar.backends.outlines_patterns import json_text_pattern

RAW = r'[^"\\\x00-\x1f]'


def test_rewrites():
    assert json_text_pattern("^a.*$") == f"^a{RAW}*$"
    assert json_text_pattern(r"^[^x]+\d$") == f"^[[^x]&&{RAW}]+\\d$"
    assert json_text_pattern(r"^[]a[]$") == f"^[[\\]a\\[]&&{RAW}]$"  # ECMA literals
    assert json_text_pattern(r'^\"q"\\$') == r'^\\"q\\"\\\\$'  # quote, quote, backslash
    assert json_text_pattern(r"^\S\s\.$") == \
        rf"^[\S&&{RAW}][\s&&[^\x00-\x1f]]\.$"


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["a", "b", "c", "d"],
          "properties": {"a": {"type": "string", "pattern": "^x.*$", "maxLength": 12},
                         "b": {"type": "string", "pattern": "^[^0-9]{2,6}$"},
                         "c": {"type": "string", "pattern": r"^\S+$", "maxLength": 8},
                         "d": {"type": "string", "pattern": '^"[a-z]{1,3}"$'}}}


def test_outlines_outputs_stay_inside_their_strings(compilers, walker):
    compiler = compilers["outlines"]
    rng = random.Random(11)
    done = 0
    for _ in range(10):
        g = compiler.compile(GrammarKey.from_constraint("json_schema", SCHEMA))
        text, finished = walker.walk(g, rng, max_steps=150)
        if finished:
            value = json.loads(text)  # before: '"' from ".*" ended the string early
            jsonschema.validate(value, SCHEMA)
            assert value["d"].startswith('"') and value["d"].endswith('"')
            done += 1
    assert done >= 5

"""Runtime-enforced string lengths end to end: the embedded model under temperature 1.0, asked
for long text, never writes past a maxLength of 140 (the grammar has no bound: the runtime
counts), and every output is valid, on both grammar backends (jump-forward, forced
completions and the mask prefetch on, as served)."""
from __future__ import annotations

import json

import jsonschema

from sgdsl.runtime.grammar.schema import normalize_schema
from sgdsl.runtime.grammar.schema.lengths import LENGTH_MARK

from ..helpers import hot_outputs

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "story", "tags"],
          "properties": {
              "title": {"type": "string", "minLength": 10, "maxLength": 140},
              "story": {"type": "string", "maxLength": 140},
              "tags": {"type": "array", "minItems": 1, "maxItems": 3,
                       "items": {"type": "string", "maxLength": 140}}}}
PROMPT = ("<|im_start|>user\nWrite a very long story about a dragon, with a long title and "
          "long tags, as JSON.<|im_end|>\n<|im_start|>assistant\n")


def test_schema_leaves_the_bounds_to_the_runtime():
    assert json.dumps(normalize_schema(SCHEMA)).count(LENGTH_MARK) == 3


def test_hot_sampling_never_passes_max_length(json_engine):
    longest = 0
    for out in hot_outputs(json_engine, PROMPT, SCHEMA, seeds=8, max_new_tokens=240):
        value = json.loads(out["text"])
        jsonschema.validate(value, SCHEMA)
        strings = [value["title"], value["story"], *value["tags"]]
        longest = max(longest, *map(len, strings))
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
    assert longest >= 120  # the model pressed on the bound: the mask, not the model, held it

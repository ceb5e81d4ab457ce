"""uniqueItems over integers and objects end to end: the embedded model at temperature 1.0,
asked for many repeats, writes only arrays whose items differ, on both grammar backends
(jump-forward, forced completions and the mask prefetch on, as served). NOTE: each item here
can always be made new within a few tokens of where a repeat shows (a digit, the tag's closing
quote); items with a few fixed values (``{"x": 0..1, "on": bool}``) can reach a repeat the probe
does not see in time, which the output check then fails (unique_items.py)."""
from __future__ import annotations

import json

import jsonschema

from .helpers import hot_outputs

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["digits", "points"],
          "properties": {
              "digits": {"type": "array", "uniqueItems": True, "minItems": 4, "maxItems": 8,
                         "items": {"type": "integer", "minimum": 0, "maximum": 9}},
              "points": {"type": "array", "uniqueItems": True, "minItems": 3, "maxItems": 5,
                         "items": {"type": "object", "additionalProperties": False,
                                   "required": ["x", "tag"],
                                   "properties": {"x": {"type": "integer", "minimum": 0,
                                                        "maximum": 9},
                                                  "tag": {"type": "string", "maxLength": 8}}}}}}
PROMPT = ("<|im_start|>user\nWrite the digit 7 eight times, and the same point five times, as "
          "JSON.<|im_end|>\n<|im_start|>assistant\n")


def test_hot_sampling_keeps_items_unique(json_engine):
    for out in hot_outputs(json_engine, PROMPT, SCHEMA, seeds=5, max_new_tokens=160):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), SCHEMA)

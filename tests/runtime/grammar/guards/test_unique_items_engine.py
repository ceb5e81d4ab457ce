"""uniqueItems end to end: the embedded model at temperature 1.0, asked for many repeats, writes
only arrays whose items differ, on both grammar backends (jump-forward, forced completions and
the mask prefetch on, as served): integers and objects, and items of a finite domain (a pattern
with nine matches, an integer range) under an object property, where every value may be used up
before minItems-free arrays end (``item_domain.py``). NOTE: each object item here can always be
made new within a few tokens of where a repeat shows (a digit, the tag's closing quote); items
with a few fixed values (``{"x": 0..1, "on": bool}``) can reach a repeat the probe does not see in
time, which the output check then fails (unique_items.py)."""
from __future__ import annotations

import json

import jsonschema

from ..helpers import hot_outputs

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
DOMAINS = {"type": "object", "additionalProperties": False, "required": ["letters", "codes"],
           "properties": {
               "letters": {"type": "array", "uniqueItems": True, "minItems": 2,
                           "items": {"type": "string", "pattern": "^[a-i]$"}},
               "codes": {"type": "array", "uniqueItems": True, "minItems": 3,
                         "items": {"type": "integer", "minimum": 1, "maximum": 12}}}}
DOMAINS_PROMPT = ("<|im_start|>user\nList the letter a twenty times and the number 3 twenty "
                  "times, as JSON.<|im_end|>\n<|im_start|>assistant\n")


def test_hot_sampling_keeps_items_unique(json_engine):
    for out in hot_outputs(json_engine, PROMPT, SCHEMA, seeds=5, max_new_tokens=160):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), SCHEMA)


def test_hot_sampling_over_finite_domains(json_engine):
    """Every finished output is valid (no repeat, no dead end let through); asked for repeats,
    the model uses a domain up in most outputs (7 and 8 of 8 when written), which the guard
    then ends."""
    used_up = 0
    for out in hot_outputs(json_engine, DOMAINS_PROMPT, DOMAINS, seeds=8, max_new_tokens=200):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        value = json.loads(out["text"])
        jsonschema.validate(value, DOMAINS)
        used_up += len(value["letters"]) == 9 or len(value["codes"]) == 12
    assert used_up >= 4

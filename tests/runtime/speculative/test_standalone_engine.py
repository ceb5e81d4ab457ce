"""Acceptance, end to end: the embedded SmolLM2 drafting for itself (STANDALONE, draft path =
its GGUF file) gives the same greedy outputs as the non-speculative engine, token for token,
across a mixed batch with chunked prefill and cache hits, stop strings, a JSON schema and a
regex; and gains more than 2 tokens per verify step."""
from __future__ import annotations

import json

import pytest

PROMPTS = [
    "Hi",
    "The capital of France is",
    "Write a haiku about the sea and the wind over the rocks at dawn.",
    "<|im_start|>user\nWhat is 12 times 7? Answer with a number.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    ",
    "List three colors of the rainbow, separated by commas, and then explain which of them "
    "is your favourite and why, in one short sentence that a child could understand.",
]
GREEDY = {"temperature": 0, "max_new_tokens": 24}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def spec_engine():
    from sgdsl.runtime import Engine
    from sgdsl.runtime.model.embedded import embedded_gguf_path

    # one grammar compile worker (two grammars here; each worker is a process importing torch)
    engine = Engine(num_threads=1, chunked_prefill_size=16, grammar_compile_workers=1,
                    speculative_algorithm="standalone",
                    speculative_draft_model_path=str(embedded_gguf_path()),
                    speculative_num_draft_tokens=4,
                    speculative_min_speedup=0)  # the cost gate off: steps are counted
    yield engine
    engine.shutdown()


def _ids(outs: list[dict]) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


def test_greedy_equals_non_speculative_with_chunks_and_cache_hits(spec_engine, embedded_engine):
    ref = _ids(embedded_engine.generate(PROMPTS, GREEDY))
    first = spec_engine.generate(PROMPTS, GREEDY)
    assert _ids(first) == ref
    second = spec_engine.generate(PROMPTS, GREEDY)
    assert _ids(second) == ref
    assert sum(o["meta_info"]["cached_tokens"] for o in second) > 0
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in first + second)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in first + second)
    assert tokens / steps > 2, (tokens, steps)  # drafting for itself: nearly every draft taken
    spec_engine.check_idle_integrity()


def test_stop_strings_json_schema_and_regex(spec_engine, embedded_engine):
    cases = [
        (PROMPTS[2], dict(GREEDY, stop=["\n", ","])),
        (CHAT.format("Describe a person as JSON."),
         dict(GREEDY, max_new_tokens=40, json_schema=json.dumps(SCHEMA))),
        (CHAT.format("Give me a phone number."),
         dict(GREEDY, max_new_tokens=30, regex=r"\(\d{3}\) \d{3}-\d{4}")),
    ]
    prompts, params = [c[0] for c in cases], [c[1] for c in cases]
    ref = embedded_engine.generate(prompts, params)
    got = spec_engine.generate(prompts, params)
    assert _ids(got) == _ids(ref)
    assert [o["text"] for o in got] == [o["text"] for o in ref]
    json.loads(got[1]["text"])
    spec_engine.check_idle_integrity()

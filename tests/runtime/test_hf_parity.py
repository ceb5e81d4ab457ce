"""Acceptance: greedy outputs of the runtime match Hugging Face transformers' ``generate`` token
for token on the embedded SmolLM2, for a batch of mixed-length prompts, with chunked prefill on
(a 16-token budget), a KV pool small enough to force retraction, and again with cache hits."""
from __future__ import annotations

import pytest
from greedy import MIXED_PROMPTS, hf_greedy

PROMPTS = MIXED_PROMPTS
MAX_NEW = 12
POOL = 72


@pytest.fixture(scope="module")
def hf_reference(embedded_dir):
    return [out for _, out in hf_greedy(embedded_dir, PROMPTS, MAX_NEW, eos_token_id=2)]


@pytest.fixture(scope="module")
def parity_engine():
    from sgdsl.runtime import Engine

    # NOTE: no grammar backend (none is sent here): its compile and estimate workers are three
    # processes that import torch, seconds of CPU on the 2-core CI box for nothing.
    engine = Engine(chunked_prefill_size=16, max_total_tokens=POOL, num_threads=1,
                    grammar_backend="none")
    yield engine
    engine.shutdown()


def test_greedy_matches_hf_with_chunking_retraction_and_cache_hits(parity_engine, hf_reference):
    params = {"temperature": 0, "max_new_tokens": MAX_NEW}
    lengths = [len(parity_engine.tokenizer.encode(p)) for p in PROMPTS]
    assert max(lengths) > 16 and min(lengths) < 16  # some prompts chunked, some not
    first = parity_engine.generate(PROMPTS, params)
    assert [r["output_ids"] for r in first] == hf_reference
    stats = parity_engine.stats()
    assert stats["retractions_total"] > 0, stats  # the small pool forced retraction
    second = parity_engine.generate(PROMPTS, params)
    assert [r["output_ids"] for r in second] == hf_reference
    assert sum(r["meta_info"]["cached_tokens"] for r in second) > 0
    parity_engine.check_idle_integrity()

"""SmolLM2 (the embedded model) through our runner vs HF transformers, fp32: mixed-length
extend, batched decode, prefix reuse, batch-1 decode; plus prompt-logits rows."""
from __future__ import annotations

import pytest

from .driver import RunnerDriver
from .parity import run_parity

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
           "Once upon a time, in a small village by the sea, there lived an old fisherman who"]


def test_smollm2_matches_hf(smollm_runner, smollm_hf, smollm_tokenizer):
    prompts = [smollm_tokenizer(p)["input_ids"] for p in PROMPTS]
    assert len({len(p) for p in prompts}) == 3  # genuinely mixed lengths
    result = run_parity(smollm_runner, smollm_hf, prompts, decode_steps=4)
    assert result.rows_checked == 3 + 3 * 4 + 4 + 1
    assert result.max_abs_diff < 2e-3, result.max_abs_diff
    assert result.ours_greedy == result.hf_greedy
    smollm_runner.token_kv_pool.check_integrity()
    smollm_runner.req_to_token_pool.check_integrity()
    assert smollm_runner.token_kv_pool.available() == smollm_runner.max_total_tokens


def test_greedy_continuation_text(smollm_runner, smollm_tokenizer):
    d = RunnerDriver(smollm_runner)
    req = d.new_request()
    logits = d.extend([(req, smollm_tokenizer(PROMPTS[0])["input_ids"])])
    out = [int(logits.argmax())]
    for _ in range(2):
        out.append(int(d.decode([(req, out[-1])]).argmax()))
    d.release(req)
    assert smollm_tokenizer.decode(out).strip().startswith("Paris")


def test_logits_indices_select_rows(smollm_runner):
    d = RunnerDriver(smollm_runner)
    a, b = d.new_request(), d.new_request()
    full = d.extend([(a, [1, 504, 3458, 282, 4649]), (b, [1, 504, 3458])],
                    logits_indices=list(range(8)))
    d.release(a), d.release(b)
    a, b = d.new_request(), d.new_request()
    last = d.extend([(a, [1, 504, 3458, 282, 4649]), (b, [1, 504, 3458])])
    d.release(a), d.release(b)
    assert full.shape == (8, 49152) and last.shape == (2, 49152)
    assert (full[4] - last[0]).abs().max() < 1e-4
    assert (full[7] - last[1]).abs().max() < 1e-4

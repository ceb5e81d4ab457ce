"""Tiny random Llama (with Llama-3.1 rope scaling), Qwen2 (qkv bias, untied head, sharded
checkpoint) and Qwen3 (q/k norm, tied head, head_dim != hidden/heads): saved by HF, loaded by
our loader, logits compared with HF on the parity scenario."""
from __future__ import annotations

import pytest

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.runner import ModelRunner

from .parity import run_parity
from .tiny import tiny_model

PROMPTS = [[5, 17, 200, 3, 99, 42, 7], [11, 12], [250, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
CASES = {
    "llama3_rope": ("llama", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    "qwen2": ("qwen2", dict(tie_word_embeddings=False, save_kwargs={"max_shard_size": "150KB"})),
    "qwen3": ("qwen3", dict(head_dim=32, tie_word_embeddings=True)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tiny_model_matches_hf(case, tmp_path):
    kind, overrides = CASES[case]
    hf = tiny_model(kind, tmp_path, **overrides)
    if case == "qwen2":
        assert (tmp_path / "model.safetensors.index.json").is_file()  # really sharded
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="cpu", max_total_tokens=256,
                                      max_running_requests=4))
    assert runner.model_config.architecture == type(hf).__name__
    result = run_parity(runner, hf, PROMPTS, decode_steps=3)
    assert result.max_abs_diff < 1e-3, result.max_abs_diff
    assert result.ours_greedy == result.hf_greedy
    runner.token_kv_pool.check_integrity()
    assert runner.token_kv_pool.available() == runner.max_total_tokens

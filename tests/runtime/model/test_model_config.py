"""ModelConfig from config.json: Llama-family, Llama-3.1 rope scaling, Qwen2/Qwen3 flags,
Mistral sliding window, and clear errors for what we cannot run."""
from __future__ import annotations

import json

import pytest

from sgdsl.runtime.errors import ModelLoadError
from sgdsl.runtime.model.embedded import embedded_model_path
from sgdsl.runtime.model.model_config import ModelConfig

LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "torch_dtype": "bfloat16",
}


def write_config(path, cfg: dict):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_embedded_smollm2():
    c = ModelConfig.from_dir(embedded_model_path())
    assert (c.architecture, c.num_layers, c.hidden_size) == ("LlamaForCausalLM", 30, 576)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.tie_word_embeddings and not c.attention_bias and not c.qk_norm
    assert c.eos_token_ids == (2,) and c.rope_theta == 100000.0
    assert c.rope_scaling.rope_type == "default" and c.max_context_len == 8192


def test_llama31_rope_scaling(tmp_path):
    c = ModelConfig.from_dir(write_config(tmp_path, LLAMA31_8B))
    assert c.rope_theta == 500000.0 and c.rope_scaling.rope_type == "llama3"
    assert c.rope_scaling.factor == 8.0 and c.rope_scaling.original_max_position_embeddings == 8192
    assert c.eos_token_ids == (128001, 128008, 128009)
    assert (c.q_size, c.kv_size, c.max_context_len) == (4096, 1024, 131072)
    assert not c.tie_word_embeddings


def test_qwen_flags(tmp_path):
    base = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    q2 = ModelConfig.from_dir(write_config(tmp_path / "q2", {
        **base, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    q3 = ModelConfig.from_dir(write_config(tmp_path / "q3", {
        **base, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32}))
    assert q2.attention_bias and not q2.qk_norm
    assert q3.qk_norm and not q3.attention_bias and q3.head_dim == 32 and q3.q_size == 128


def test_mistral_sliding_window_caps_context(tmp_path):
    c = ModelConfig.from_dir(write_config(tmp_path, {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 32768,
        "sliding_window": 4096}))
    assert c.max_context_len == 4096


def test_unknown_architecture_lists_supported(tmp_path):
    write_config(tmp_path, {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    with pytest.raises(ModelLoadError) as err:
        ModelConfig.from_dir(tmp_path)
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg and "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg


def test_unsupported_rope_type(tmp_path):
    cfg = {**LLAMA31_8B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 8192}}
    with pytest.raises(ModelLoadError, match="yarn"):
        ModelConfig.from_dir(write_config(tmp_path, cfg))


def test_missing_config_json(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        ModelConfig.from_dir(tmp_path)

"""Tiny random HF models built from a config in the test, saved to a directory the loader reads.

Every parameter is randomized (HF leaves biases at zero and norms at one), so a loader that
dropped a bias or a norm weight would show up as a logits mismatch.
"""
from __future__ import annotations

from pathlib import Path

import torch

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6)


def save_tiny(hf_model, path: Path, seed: int = 0, weight_std: float = 0.2,
              **save_kwargs) -> Path:
    """``weight_std``: spread of the non-norm weights (0.2 makes logits differ clearly; lower
    values give a less chaotic net, whose outputs move smoothly with weight noise)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + noise * 0.1 if "norm" in name else noise * weight_std)
    hf_model.eval()
    hf_model.save_pretrained(str(path), **save_kwargs)
    return path


def tiny_model(kind: str, path: Path, **overrides):
    """Build, randomize and save an HF model of ``kind`` in {llama, qwen2, qwen3, qwen3_moe, mixtral}; returns it."""
    import transformers as tf

    cfg_cls, model_cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                          "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
                          "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
                          "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
                          "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM)}[kind]
    save_kwargs = overrides.pop("save_kwargs", {})
    weight_std = overrides.pop("weight_std", 0.2)
    config = cfg_cls(**{**TINY, **overrides})
    torch.manual_seed(0)
    model = model_cls(config).float()
    save_tiny(model, path, weight_std=weight_std, **save_kwargs)
    return model

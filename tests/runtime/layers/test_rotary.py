"""Rotary: inverse frequencies vs transformers' rope init functions (default, linear, llama3),
and application vs HF's apply_rotary_pos_emb."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from sgdsl.runtime.layers.rotary import RotaryEmbedding, inv_frequencies
from sgdsl.runtime.model.model_config import RopeScaling

PARAMS = {
    "default": ({"rope_type": "default"}, RopeScaling()),
    "linear": ({"rope_type": "linear", "factor": 4.0}, RopeScaling("linear", 4.0)),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
               RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)),
}


@pytest.mark.parametrize("kind", list(PARAMS))
def test_inv_freq_matches_transformers(kind):
    hf_params, ours = PARAMS[kind]
    config = LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072,
                         rope_parameters={**hf_params, "rope_theta": 500000.0})
    if kind == "default":
        expected = 1.0 / (500000.0 ** (torch.arange(0, 128, 2).float() / 128))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    got = inv_frequencies(128, 500000.0, ours)
    torch.testing.assert_close(got, expected.float(), rtol=1e-6, atol=0)


def test_apply_matches_hf():
    rope = RotaryEmbedding(32, 128, 10000.0, RopeScaling())
    positions = torch.tensor([0, 5, 127, 64])
    q, k = torch.randn(4, 3, 32), torch.randn(4, 1, 32)
    cos, sin = rope.lookup(positions)
    ours = RotaryEmbedding.apply(torch.cat((q, k), dim=1), cos, sin)
    # HF layout: [batch, heads, seq, dim] with cos/sin [batch, seq, dim]
    hf_cos, hf_sin = rope.cos_cache[positions], rope.sin_cache[positions]
    hf_sin[:, :16] = -hf_sin[:, :16]  # undo the pre-signed first half
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                      hf_cos[None], hf_sin[None])
    torch.testing.assert_close(ours[:, :3], hf_q[0].transpose(0, 1))
    torch.testing.assert_close(ours[:, 3:], hf_k[0].transpose(0, 1))
    assert torch.equal(ours[0], torch.cat((q, k), dim=1)[0])  # position 0: identity

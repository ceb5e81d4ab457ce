"""Qwen3: the Llama decoder plus a per-head RMSNorm on q and k (over head_dim) before rotary."""
from __future__ import annotations

import torch

from ..layers.norm import RMSNorm
from ..layers.quantization.base import QuantConfig
from ..layers.rotary import RotaryEmbedding
from .llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel, Rope
from .model_config import ModelConfig


class Qwen3Attention(LlamaAttention):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None = None) -> None:
        super().__init__(cfg, layer_id, dtype, device, quant)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype=dtype, device=device)

    def qk_norms(self) -> tuple[RMSNorm, RMSNorm]:
        return self.q_norm, self.k_norm

    def rotate_qk(self, qk: torch.Tensor, rope: Rope) -> torch.Tensor:
        """The torch path: each norm, then the rotary."""
        h = self.num_heads
        normed = torch.cat((self.q_norm(qk[:, :h]), self.k_norm(qk[:, h:])), dim=1)
        return RotaryEmbedding.apply(normed, *rope)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model

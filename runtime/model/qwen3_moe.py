"""Qwen3-MoE (e.g. Qwen3-30B-A3B): the Qwen3 decoder (q/k norms) whose MLP is, in the layers
``ModelConfig.moe_layers`` names, 128 routed experts with top-8 softmax routing (renormalized
when ``norm_topk_prob``); the other layers keep a dense MLP."""
from __future__ import annotations

import torch
from torch import nn

from ..layers.quantization.base import QuantConfig
from .llama import LlamaMLP
from .model_config import ModelConfig
from .moe_model import MoEForCausalLMMixin
from .qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM, Qwen3Model
from .sparse_moe import SparseMoeBlock


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def make_mlp(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None) -> nn.Module:
        if layer_id in cfg.moe_layers:
            return SparseMoeBlock(cfg, dtype, device, quant)
        return LlamaMLP(cfg, dtype, device, quant)


class Qwen3MoeModel(Qwen3Model):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(MoEForCausalLMMixin, Qwen3ForCausalLM):
    model_cls = Qwen3MoeModel

"""Mixtral (e.g. 8x7B): the Llama decoder with every MLP replaced by 8 routed experts, top-2
softmax routing renormalized over the chosen two. Checkpoints name the block
``block_sparse_moe`` and the expert projections w1 (gate), w3 (up), w2 (down)."""
from __future__ import annotations

import torch
from torch import nn

from ..layers.quantization.base import QuantConfig
from .llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from .model_config import ModelConfig
from .moe_model import MoEForCausalLMMixin
from .sparse_moe import SparseMoeBlock


class MixtralDecoderLayer(LlamaDecoderLayer):
    def make_mlp(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None) -> nn.Module:
        return SparseMoeBlock(cfg, dtype, device, quant)


class MixtralModel(LlamaModel):
    layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(MoEForCausalLMMixin, LlamaForCausalLM):
    model_cls = MixtralModel
    checkpoint_renames = ((".block_sparse_moe.", ".mlp."),)

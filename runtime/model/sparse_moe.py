"""The routed feed-forward block of MoE decoders (Qwen3-MoE, Mixtral): a router (``gate``, a
replicated linear layer kept in the model dtype) and the experts (``FusedMoE``).

Checkpoints store each expert's projections as separate tensors; ``expert_tensor`` parses
their names (both families' spellings) so the model can route them into the fused weights.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from ..layers.linear import Linear
from ..layers.moe.layer import FusedMoE
from ..layers.quantization.base import QuantConfig
from .model_config import ModelConfig

# Qwen3-MoE: experts.N.{gate,up,down}_proj; Mixtral: experts.N.{w1 (gate), w3 (up), w2 (down)}
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\."
                     r"(weight|weight_scale|weight_scale_inv|input_scale)$")
_SHARD = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down",
          "w2": "down"}


def expert_tensor(name: str) -> tuple[str, int, str, str] | None:
    """``(experts module name, expert, shard, kind)`` for an expert tensor's name, else None."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    return m.group(1), int(m.group(2)), _SHARD[m.group(3)], m.group(4)


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None = None) -> None:
        super().__init__()
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, dtype=dtype, device=device)
        self.experts = FusedMoE(cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                cfg.moe_intermediate_size, renormalize=cfg.norm_topk_prob,
                                quant=quant, dtype=dtype, device=device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``[T, H]``, or on the GPU ``[T, top_k, H]``: the weighted expert rows, which the
        decoder's next add+RMSNorm sums in its own kernel (``layers/norm.py``: no combine
        launch; the block's output only ever feeds that norm)."""
        return self.experts(h, self.gate(h), sum_experts=False)

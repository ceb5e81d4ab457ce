"""FusedMoE: the routed experts of one MoE layer.

Tensor parallelism splits every expert's intermediate dim the way a dense MLP is split (gate/up
by rows, down by columns), so each rank computes a partial sum of every token's output and one
all-reduce after the weighted combine completes it. The expert weights and the product come
from the quant method (unquantized, or fp8; see ``layers/quantization``).
"""
from __future__ import annotations

import torch
from torch import nn

from ...distributed.collectives import all_reduce
from ...distributed.state import get_tp_group
from ...errors import ModelLoadError
from ..quantization.base import QuantConfig
from .method import UnquantizedMoEMethod
from .router import select_experts


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden: int, intermediate: int, *,
                 renormalize: bool, quant: QuantConfig | None = None, prefix: str = "",
                 reduce_results: bool = True, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        group = get_tp_group()
        self.tp_rank, self.tp_size = group.rank, group.size
        if intermediate % self.tp_size:
            raise ModelLoadError(f"moe_intermediate_size={intermediate} is not divisible by "
                                 f"tp_size={self.tp_size}")
        if not 0 < top_k <= num_experts:
            raise ModelLoadError(f"num_experts_per_tok={top_k} must be in [1, {num_experts}]")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.hidden, self.inter_per_rank = hidden, intermediate // self.tp_size
        self.reduce_results = reduce_results
        self.quant_method = (quant.get_moe_method(self, prefix) if quant is not None
                             else UnquantizedMoEMethod())
        self.quant_method.create_weights(self, num_experts, hidden, self.inter_per_rank, dtype,
                                         device)

    def load_expert(self, expert: int, shard: str, kind: str, tensor: torch.Tensor) -> None:
        """One checkpoint tensor of one expert (full size; this rank keeps its slice)."""
        if not 0 <= expert < self.num_experts:
            raise ModelLoadError(f"expert index {expert} out of range [0, {self.num_experts})")
        self.quant_method.load_expert(self, expert, shard, kind, tensor)

    def process_weights_after_loading(self) -> None:
        hook = getattr(self.quant_method, "process_weights_after_loading", None)
        if hook is not None:
            hook(self)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor,
                sum_experts: bool = True) -> torch.Tensor:
        """``[T, H]``; ``sum_experts=False`` allows ``[T, k, H]``, the weighted expert rows
        left for the caller to sum (see ``MoEMethod.apply``)."""
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        # NOTE: under TP the rows are summed before the all-reduce (k times fewer bytes).
        sum_experts = sum_experts or (self.reduce_results and self.tp_size > 1)
        out = self.quant_method.apply(self, x, weights, ids, sum_experts=sum_experts)
        return all_reduce(out) if self.reduce_results else out

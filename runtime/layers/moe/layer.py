"""FusedMoE: the routed experts of one MoE layer.

Tensor parallelism splits every expert's intermediate dim the way a dense MLP is split (gate/up
by rows, down by columns), so each rank computes a partial sum of every token's output and one
all-reduce after the weighted combine completes it. Expert parallelism (``ep_size`` > 1) gives
each EP rank ``num_experts / ep_size`` whole experts (split by intermediate dim only over the
``tp_size / ep_size`` ranks of its MoE-TP group) and moves the tokens to them, or computes
its experts' part of every token and all-reduces (``ep_dispatch``: by default the all-reduce
for decode and CUDA graphs, the all-to-all for large batches; see dispatch.py).
The expert weights and the product come from the quant method (unquantized, or fp8; see
``layers/quantization``).
"""
from __future__ import annotations

import torch
from torch import nn

from ...distributed.collectives import all_reduce
from ...distributed.state import get_ep_group, get_moe_tp_group, get_tp_group
from ...errors import ModelLoadError
from ..quantization.base import QuantConfig
from .dispatch import ep_dispatch, expert_parallel_moe, local_experts_moe
from .method import UnquantizedMoEMethod
from .router import select_experts


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden: int, intermediate: int, *,
                 renormalize: bool, quant: QuantConfig | None = None, prefix: str = "",
                 reduce_results: bool = True, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.ep = get_ep_group()
        check_expert_split(num_experts, self.ep.size)
        # tp_rank / tp_size: the split of each expert's intermediate dim (the MoE-TP group:
        # the whole TP group without expert parallelism)
        group = get_moe_tp_group() if self.ep.size > 1 else get_tp_group()
        self.tp_rank, self.tp_size = group.rank, group.size
        if intermediate % self.tp_size:
            raise ModelLoadError(f"moe_intermediate_size={intermediate} is not divisible by "
                                 f"the {self.tp_size} ranks that split each expert")
        if not 0 < top_k <= num_experts:
            raise ModelLoadError(f"num_experts_per_tok={top_k} must be in [1, {num_experts}]")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.num_local_experts = num_experts // self.ep.size
        self.first_expert = self.ep.rank * self.num_local_experts
        self.ep_dispatch = ep_dispatch()
        self.hidden, self.inter_per_rank = hidden, intermediate // self.tp_size
        self.reduce_results = reduce_results
        self.quant_method = (quant.get_moe_method(self, prefix) if quant is not None
                             else UnquantizedMoEMethod())
        self.quant_method.create_weights(self, self.num_local_experts, hidden,
                                         self.inter_per_rank, dtype, device)

    def load_expert(self, expert: int, shard: str, kind: str, tensor: torch.Tensor) -> None:
        """One checkpoint tensor of one expert (full size; this rank keeps its slice). Under
        expert parallelism another rank's expert is skipped (a lazy view is never read)."""
        if not 0 <= expert < self.num_experts:
            raise ModelLoadError(f"expert index {expert} out of range [0, {self.num_experts})")
        local = expert - self.first_expert
        if 0 <= local < self.num_local_experts:
            self.quant_method.load_expert(self, local, shard, kind, tensor)

    def process_weights_after_loading(self) -> None:
        hook = getattr(self.quant_method, "process_weights_after_loading", None)
        if hook is not None:
            hook(self)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor,
                sum_experts: bool = True) -> torch.Tensor:
        """``[T, H]``; ``sum_experts=False`` allows ``[T, k, H]``, the weighted expert rows
        left for the caller to sum (see ``MoEMethod.apply``; expert parallelism always sums)."""
        if self.ep.size > 1:
            # NOTE: a CUDA graph cannot hold the host-side split sizes: the policy picks the
            # all_reduce path or the padded all-to-all there
            path = self.ep_dispatch.path(x)
            if path == "all_reduce":  # ids local to this rank's experts
                weights, ids = select_experts(router_logits, self.top_k, self.renormalize,
                                              (self.first_expert, self.num_local_experts))
                return local_experts_moe(self, x, weights, ids)
            weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
            return expert_parallel_moe(self, x, weights, ids, self.ep, get_moe_tp_group(),
                                       path == "padded")
        weights, ids = select_experts(router_logits, self.top_k, self.renormalize)
        # NOTE: under TP the rows are summed before the all-reduce (k times fewer bytes).
        sum_experts = sum_experts or (self.reduce_results and self.tp_size > 1)
        out = self.quant_method.apply(self, x, weights, ids, sum_experts=sum_experts)
        return all_reduce(out) if self.reduce_results else out


def check_expert_split(num_experts: int, ep_size: int) -> None:
    """ep_size must split the experts evenly (and only a MoE model has experts to split)."""
    if num_experts == 0 and ep_size > 1:
        raise ModelLoadError(f"ep_size={ep_size}: the model has no experts (expert "
                             "parallelism is for MoE models); use ep_size=1")
    if num_experts % ep_size:
        raise ModelLoadError(f"ep_size={ep_size} does not divide the model's {num_experts} "
                             f"experts; use an ep_size that divides {num_experts}")

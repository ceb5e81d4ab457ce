"""Top-k routing as Qwen3-MoE and Mixtral define it: softmax over all experts in fp32, the k
largest, optionally renormalized to sum to 1 (Mixtral always; Qwen3-MoE when
``norm_topk_prob``).

``local=(first, count)`` (expert parallelism's all_reduce path) returns ids local to one rank's
experts, ``count`` marking another rank's expert; the weights are unchanged."""
from __future__ import annotations

import torch

from ...kernels.dispatch import use_triton


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                   local: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_logits [T, E]`` -> ``(weights [T, k] fp32, ids [T, k] int32)``; on the GPU
    one fused kernel (``kernels/moe_routing.py``)."""
    if use_triton(router_logits) and router_logits.dim() == 2:
        from ...kernels.moe_routing import topk_softmax

        return topk_softmax(router_logits.contiguous(), top_k, renormalize, local)
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if local is not None:
        first, count = local
        rel = ids - first
        ids = torch.where((rel >= 0) & (rel < count), rel, count)
    return weights, ids.to(torch.int32)

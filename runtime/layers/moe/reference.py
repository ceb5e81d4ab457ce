"""The MoE product in plain torch: the CPU path and the reference of the fused kernels.

For each expert that any token picked: gather its tokens, ``silu(x Wg^T) * (x Wu^T)``, then
``W2``, scaled by the routing weight and added into the token's output row (fp32 sums).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# expert index -> (w13 [2I, H], w2 [H, I]) in a float dtype
ExpertWeights = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def moe_reference(x: torch.Tensor, expert_weights: ExpertWeights, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor,
                  act_quant: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """``x [T, H]`` -> ``[T, H]`` in x's dtype. ``act_quant`` rounds each GEMM input (the fp8
    paths' activation quantization), None: exact."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    for expert in torch.unique(ids).tolist():
        rows, slots = torch.nonzero(ids == expert, as_tuple=True)
        w13, w2 = expert_weights(expert)
        h = x[rows]
        if act_quant is not None:
            h = act_quant(h)
        gate_up = F.linear(h.to(w13.dtype), w13)
        inter = gate_up.shape[-1] // 2
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        if act_quant is not None:
            act = act_quant(act)
        y = F.linear(act.to(w2.dtype), w2).float()
        out.index_add_(0, rows, y * topk_weights[rows, slots].float().unsqueeze(-1))
    return out.to(x.dtype)

"""RMSNorm with an optional fused residual add (``x + residual`` then normalize), the pattern
every pre-norm decoder layer repeats twice.

After a MoE layer on the GPU, ``x`` may be ``[tokens, top_k, hidden]``: each token's weighted
expert rows, not yet summed (``SparseMoeBlock``); the add sums them first, inside the same
kernel (one launch fewer per MoE layer than a separate combine)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.dispatch import use_triton


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``, or with ``residual``: ``(norm(x + residual), x + residual)``; ``x`` one
        dim more than ``residual``: ``x.sum(-2)`` (fp32, rounded to the dtype) is added."""
        if use_triton(x):  # GPU path (issue 6): one fused kernel instead of ~8 torch ops
            return self._forward_triton(x, residual)
        if residual is not None:
            if x.dim() == residual.dim() + 1:
                x = x.sum(-2, dtype=torch.float32).to(x.dtype)
            x = x + residual
            return self._norm(x), x
        return self._norm(x)

    def _forward_triton(self, x: torch.Tensor, residual: torch.Tensor | None
                        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        from ..kernels.rmsnorm import fused_add_rmsnorm, rmsnorm

        if residual is None:
            x2 = x.reshape(-1, self.hidden_size)
            return rmsnorm(x2, self.weight, self.eps).view(x.shape)
        parts = x.shape[-2:] if x.dim() == residual.dim() + 1 else (self.hidden_size,)
        out, res = fused_add_rmsnorm(x.reshape(-1, *parts), residual.reshape(-1, self.hidden_size),
                                     self.weight, self.eps, inplace=False)
        return out.view(residual.shape), res.view(residual.shape)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # NOTE: F.rms_norm is one kernel on CPU and matches the manual formula bit for bit.
            return F.rms_norm(x, (self.hidden_size,), self.weight, self.eps)
        # Half precision: normalize in fp32 like the reference implementations do.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

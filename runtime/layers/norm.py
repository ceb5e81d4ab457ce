"""RMSNorm with an optional fused residual add (``x + residual`` then normalize), the pattern
every pre-norm decoder layer repeats twice."""
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
        """``norm(x)``, or with ``residual``: ``(norm(x + residual), x + residual)``."""
        if use_triton(x):  # GPU path (issue 6): one fused kernel instead of ~8 torch ops
            return self._forward_triton(x, residual)
        if residual is not None:
            x = x + residual
            return self._norm(x), x
        return self._norm(x)

    def _forward_triton(self, x: torch.Tensor, residual: torch.Tensor | None
                        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        from ..kernels.rmsnorm import fused_add_rmsnorm, rmsnorm

        x2 = x.reshape(-1, self.hidden_size)
        if residual is None:
            return rmsnorm(x2, self.weight, self.eps).view(x.shape)
        out, res = fused_add_rmsnorm(x2, residual.reshape(-1, self.hidden_size), self.weight,
                                     self.eps, inplace=False)
        return out.view(x.shape), res.view(x.shape)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # NOTE: F.rms_norm is one kernel on CPU and matches the manual formula bit for bit.
            return F.rms_norm(x, (self.hidden_size,), self.weight, self.eps)
        # Half precision: normalize in fp32 like the reference implementations do.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

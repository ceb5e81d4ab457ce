"""SiLU-and-mul: the gated MLP activation over a packed ``[gate | up]`` projection."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.dispatch import use_triton


class SiluAndMul(nn.Module):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for ``gate_up = [..., 2 * d]``; returns ``[..., d]``."""
        if use_triton(gate_up) and gate_up.dim() == 2:  # GPU path (issue 6): one kernel
            from ..kernels.activation import silu_and_mul

            return silu_and_mul(gate_up)
        d = gate_up.shape[-1] // 2
        return F.silu(gate_up[..., :d]) * gate_up[..., d:]

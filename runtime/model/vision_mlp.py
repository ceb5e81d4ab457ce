"""A vision tower's gated MLP (``down(act(gate(x)) * up(x))``, linears with bias) with HF's
parameter names and shapes, stored zero-padded and packed so the GPU runs it as two aligned
GEMMs and one fused activation.

Why: Qwen2.5-VL's tower has ``intermediate_size`` 3420, not a multiple of 8. A bf16 row of 3420
is 6840 bytes, so the gate/up outputs and the down projection's input and weight have leading
dimensions that are not 16-byte aligned, which keeps cuBLAS off its TMA/wgmma (Hopper) kernels
for 2/3 of the tower's FLOPs. Here gate and up are rows ``[0, I)`` and ``[P, P + I)`` of one
``[2P, dim]`` weight (P = I rounded up to ``PAD``), the down weight is ``[dim, P]``; the
padding is zero, so the padded columns carry ``act(0) * 0 = 0`` and add nothing: the result is
the unpadded MLP's (exactly, up to the GEMMs' summation order).

The parameters (``gate_proj.weight`` ``[I, dim]`` etc.) are views into those buffers, so
checkpoint loading, ``load_state_dict``, dummy fills and ``state_dict`` see HF's layout and
never touch the padding. ``Module.to`` re-allocates parameters and buffers separately;
``_apply`` points the parameters back into the converted buffers.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.dispatch import use_triton

PAD = 64  # elements: 128 bytes in bf16, a whole number of GEMM K-tiles' worth of alignment

ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu": F.gelu, "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.hidden, self.padded = hidden, -(-hidden // PAD) * PAD
        self.act_name, self.act = act, ACTS[act]
        self.gate_proj = nn.Linear(dim, hidden)
        self.up_proj = nn.Linear(dim, hidden)
        self.down_proj = nn.Linear(hidden, dim)
        ref, p = self.gate_proj.weight, self.padded
        for name, shape in (("gate_up_weight", (2 * p, dim)), ("gate_up_bias", (2 * p,)),
                            ("down_weight", (dim, p))):
            self.register_buffer(name, ref.new_zeros(shape), persistent=False)
        with torch.no_grad():  # the nn.Linear init, moved into the buffers
            for view, param in zip(self._views(), self._params()):
                view.copy_(param)
        self._point()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = F.linear(x, self.gate_up_weight, self.gate_up_bias)
        if self.act_name == "silu" and use_triton(gate_up) and gate_up.dim() == 2:
            from ..kernels.activation import silu_and_mul  # one pass, HF's rounding

            h = silu_and_mul(gate_up)
        else:
            h = self.act(gate_up[..., :self.padded]) * gate_up[..., self.padded:]
        return F.linear(h, self.down_weight, self.down_proj.bias)

    def _params(self) -> tuple[nn.Parameter, ...]:
        return (self.gate_proj.weight, self.up_proj.weight, self.gate_proj.bias,
                self.up_proj.bias, self.down_proj.weight)

    def _views(self) -> tuple[torch.Tensor, ...]:
        i, p = self.hidden, self.padded
        return (self.gate_up_weight[:i], self.gate_up_weight[p:p + i], self.gate_up_bias[:i],
                self.gate_up_bias[p:p + i], self.down_weight[:, :i])

    def _point(self) -> None:
        """Parameters become views of the padded buffers (their values already there)."""
        for view, param in zip(self._views(), self._params()):
            param.data = view

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], *args: Any, **kwargs: Any
               ) -> "VisionMLP":
        # NOTE: the children's parameters (views) and the buffers are converted one by one
        # from the same storage, so the new buffers hold the values; re-share them
        super()._apply(fn, *args, **kwargs)
        self._point()
        return self

"""Quantization hooks of the linear layers (shared interface: /work/team/PARALLEL_LAYERS.md).

A ``QuantConfig`` names a method; each linear layer asks it for a ``LinearMethod``, which
creates the layer's parameters at their per-rank shapes, post-processes them after loading, and
computes ``x @ W.T (+ bias)``. Layers without a QuantConfig use ``UnquantizedLinearMethod``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class LinearMethod(ABC):
    """How one linear layer stores and applies its weight."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, in_per_rank: int, out_per_rank: int,
                       dtype: torch.dtype, device: torch.device | str | None = None) -> None:
        """Register the layer's parameters (``weight`` at least) at this rank's shapes. Each
        parameter carries ``input_dim`` / ``output_dim`` (the dims split over ranks, or None)
        and a ``weight_loader(param, full_tensor, shard_id=None)`` (set by the layer)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack or convert after every shard arrived (default: nothing)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + bias`` with this rank's weight."""


@dataclass(frozen=True)
class QuantConfig:
    """A checkpoint's quantization (e.g. ``method="fp8"``); methods live next to this file."""

    method: str
    weight_block_size: tuple[int, int] | None = None
    activation_scheme: str = "dynamic"

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        raise NotImplementedError(f"quantization method {self.method!r} has no linear method")

    def get_moe_method(self, layer: nn.Module) -> Any:
        raise NotImplementedError(f"quantization method {self.method!r} has no MoE method")


class UnquantizedLinearMethod(LinearMethod):
    """Plain weights in the model dtype. On CPU the weight may be re-laid for matrix-vector
    products after loading (``layers.linear.cpu_layout``: 3-D), which ``apply`` handles."""

    def create_weights(self, layer: nn.Module, in_per_rank: int, out_per_rank: int,
                       dtype: torch.dtype, device: torch.device | str | None = None) -> None:
        # NOTE: torch.empty (no init): the loader overwrites every value.
        weight = nn.Parameter(torch.empty(out_per_rank, in_per_rank, dtype=dtype, device=device),
                              requires_grad=False)
        weight.input_dim, weight.output_dim = 1, 0
        layer.register_parameter("weight", weight)

    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        weight = layer.weight
        if weight.dim() == 3:  # CPU split layout, see LinearBase.use_cpu_layout
            from ..linear import split_matmul

            out = split_matmul(x, weight)
            return out if bias is None else out + bias
        return F.linear(x, weight, bias)


def linear_method(quant: QuantConfig | None, layer: nn.Module) -> LinearMethod:
    return UnquantizedLinearMethod() if quant is None else quant.get_linear_method(layer)

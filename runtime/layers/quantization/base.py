"""Quantization hooks of the linear and MoE layers (shared interface: PARALLEL_LAYERS in the
team notes).

A ``QuantConfig`` names a method; each linear layer asks it for a ``LinearMethod``, which
creates the layer's parameters at their per-rank shapes, post-processes them after loading, and
computes ``x @ W.T (+ bias)``; each MoE layer asks for a ``MoEMethod`` likewise. Layers without
a QuantConfig use the unquantized methods.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ModelLoadError

SUPPORTED_METHODS = ("fp8",)
DECODE_ROWS = 16  # see kernels/decode_gemm.py (kept here so CPU installs never import Triton)


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

    def adapt_checkpoint_tensor(self, layer: nn.Module, param: nn.Parameter, loaded: Any,
                                full_rows: int) -> Any:
        """The checkpoint tensor as ``param``'s loader expects it (default: as is); e.g. a
        per-tensor scale expanded to one per output row. ``full_rows``: the shard's rows."""
        return loaded

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + bias`` with this rank's weight."""


@dataclass(frozen=True)
class QuantConfig:
    """How weights are stored. ``checkpoint_fp8``: the checkpoint already holds fp8 weights
    (HF ``quantization_config.quant_method == "fp8"``); otherwise bf16/fp32 weights are
    quantized after loading. ``weight_block_size``: (rows, cols) of one weight scale
    (block-wise checkpoints, e.g. (128, 128)); None: one scale per output channel."""

    method: str
    weight_block_size: tuple[int, int] | None = None
    activation_scheme: str = "dynamic"
    checkpoint_fp8: bool = False
    # Module-name fragments left unquantized (HF ``modules_to_not_convert`` / ``ignored_layers``).
    skip_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in SUPPORTED_METHODS:
            raise ModelLoadError(f"quantization={self.method!r} is not supported; supported: "
                                 f"{', '.join(SUPPORTED_METHODS)}")
        if self.weight_block_size is not None and len(self.weight_block_size) != 2:
            raise ModelLoadError(f"weight_block_size={self.weight_block_size!r}: need [rows, cols]")

    @classmethod
    def resolve(cls, cli: str | None, hf: dict[str, Any] | None) -> "QuantConfig | None":
        """The config for a model: the checkpoint's ``quantization_config`` wins (its weights
        are stored that way); ``cli`` (``--quantization``) asks to quantize a bf16 checkpoint."""
        if hf:
            method = hf.get("quant_method")
            if method != "fp8":
                raise ModelLoadError(f"checkpoint quantization_config.quant_method={method!r} "
                                     f"is not supported; supported: fp8")
            if cli not in (None, "fp8"):
                raise ModelLoadError(f"quantization={cli!r} conflicts with the checkpoint's "
                                     f"quant_method 'fp8'")
            block = hf.get("weight_block_size")
            skip = tuple(hf.get("modules_to_not_convert") or hf.get("ignored_layers") or ())
            return cls("fp8", tuple(block) if block else None,
                       hf.get("activation_scheme", "dynamic"), True, skip)
        if cli is None:
            return None
        return cls(cli)

    def skips(self, prefix: str) -> bool:
        return any(s and s in prefix for s in self.skip_modules)

    def get_linear_method(self, layer: nn.Module, prefix: str = "") -> LinearMethod:
        from .fp8 import Fp8LinearMethod

        return UnquantizedLinearMethod() if self.skips(prefix) else Fp8LinearMethod(self)

    def get_moe_method(self, layer: nn.Module, prefix: str = "") -> "MoEMethod":
        from ..moe.method import UnquantizedMoEMethod
        from .fp8 import Fp8MoEMethod

        return UnquantizedMoEMethod() if self.skips(prefix) else Fp8MoEMethod(self)


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
        if x.is_cuda and x.dim() == 2 and x.shape[0] <= DECODE_ROWS:
            from ...kernels.decode_gemm import decode_linear

            return decode_linear(x, weight, bias)  # cuBLAS or Triton, the faster per shape
        return F.linear(x, weight, bias)


def linear_method(quant: QuantConfig | None, layer: nn.Module) -> LinearMethod:
    return UnquantizedLinearMethod() if quant is None else quant.get_linear_method(layer)


class MoEMethod(ABC):
    """Expert weights (``w13`` [E, 2I, H] = gate|up, ``w2`` [E, H, I]) and the MoE product."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, inter: int,
                       dtype: torch.dtype, device: torch.device | str | None) -> None: ...

    @abstractmethod
    def load_expert(self, layer: nn.Module, expert: int, shard: str, kind: str,
                    tensor: Any) -> None:
        """``shard`` in gate/up/down; ``kind`` weight, weight_scale or weight_scale_inv;
        ``tensor`` the full checkpoint tensor (or a lazy safetensors slice)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, sum_experts: bool = True) -> torch.Tensor:
        """Weighted sum over each token's experts, ``[T, H]`` in x's dtype (this rank's part).
        ``sum_experts=False`` allows (GPU kernels) ``[T, k, H]``: the weighted rows unsummed."""


def _check_shape(name: str, tensor: Any, target: torch.Tensor | tuple[int, ...]) -> None:
    """``target``: the parameter (view) a checkpoint tensor fills, or the full shape expected."""
    from ..weight_slices import shape_of

    want = tuple(target.shape) if isinstance(target, torch.Tensor) else tuple(target)
    if shape_of(tensor) != want:
        raise ModelLoadError(f"weight {name}: checkpoint shape {shape_of(tensor)} != "
                             f"model shape {want}")

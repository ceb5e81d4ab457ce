"""FP8 (E4M3) weights for linear layers and experts.

Two storage formats, both read as published:
- per output channel: ``weight`` fp8 ``[out, in]`` + ``weight_scale`` fp32 ``[out]``. A bf16
  checkpoint with ``--quantization fp8`` loads in bf16 and is quantized right after loading
  (``process_weights_after_loading``, one layer at a time), and per-tensor scales of older fp8
  checkpoints land here too (each shard's scalar fills its rows).
- block-wise: ``weight`` + ``weight_scale_inv`` ``[ceil(out/bn), ceil(in/bk)]`` (HF
  ``weight_block_size``, e.g. 128x128; despite the name it multiplies, like ``weight_scale``).

Products on the GPU: per-channel weights with small batches use the weight-only Triton GEMM,
larger batches quantize activations per token and run ``torch._scaled_mm``; block-wise weights
use the Triton GEMM. On the CPU (reference and tests): dequantize, fake-quantize activations
per token the way the GPU's ``_scaled_mm`` path does, multiply in fp32.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ModelLoadError
from ..weight_slices import materialize
from .base import (LinearMethod, MoEMethod, QuantConfig, UnquantizedLinearMethod,
                   _check_shape)
from .fp8_utils import FP8_DTYPE, dequantize, fake_quant_rows, quantize_blocks, quantize_rows

# Rows up to which the weight-only kernel beats activation quantization + _scaled_mm (decode).
SMALL_BATCH_ROWS = 32


def _param(shape: tuple[int, ...], dtype: torch.dtype, device, fill: float | None = None
           ) -> nn.Parameter:
    t = torch.empty(shape, dtype=dtype, device=device)
    if fill is not None:
        t.fill_(fill)
    return nn.Parameter(t, requires_grad=False)


def _blocks(n: int, b: int) -> int:
    return -(-n // b)


class Fp8LinearMethod(LinearMethod):
    def __init__(self, config: QuantConfig) -> None:
        self.block = config.weight_block_size
        self.from_checkpoint = config.checkpoint_fp8

    def create_weights(self, layer: nn.Module, in_per_rank: int, out_per_rank: int,
                       dtype: torch.dtype, device=None) -> None:
        if not self.from_checkpoint:
            # --quantization fp8: load the bf16 weight as usual, quantize it afterwards
            UnquantizedLinearMethod().create_weights(layer, in_per_rank, out_per_rank, dtype,
                                                     device)
            return
        weight = _param((out_per_rank, in_per_rank), FP8_DTYPE, device)
        weight.input_dim, weight.output_dim = 1, 0
        layer.register_parameter("weight", weight)
        # NOTE: NaN until loaded, so a scale the checkpoint lacks cannot pass unnoticed.
        if self.block is None:
            scale = _param((out_per_rank,), torch.float32, device, float("nan"))
            scale.input_dim, scale.output_dim = None, 0
            layer.register_parameter("weight_scale", scale)
            return
        bn, bk = self.block
        scale = _param((_blocks(out_per_rank, bn), _blocks(in_per_rank, bk)), torch.float32,
                       device, float("nan"))
        scale.input_dim, scale.output_dim, scale.row_block = 1, 0, bn
        layer.register_parameter("weight_scale_inv", scale)

    def adapt_checkpoint_tensor(self, layer: nn.Module, param: nn.Parameter, loaded: Any,
                                full_rows: int) -> Any:
        """Per-tensor scales (older fp8 checkpoints: one scalar per q/k/v/gate/up shard) fill
        every row of their shard; ``[rows, 1]`` per-channel scales drop the unit dim."""
        if param is not getattr(layer, "weight_scale", None):
            return loaded
        scale = materialize(loaded).float().reshape(-1)
        return scale.expand(full_rows).contiguous() if scale.numel() == 1 else scale

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.from_checkpoint:
            return
        q, scale = quantize_rows(layer.weight.data)
        weight = _param(tuple(q.shape), FP8_DTYPE, q.device)
        weight.data.copy_(q)
        weight.input_dim, weight.output_dim = 1, 0
        del layer.weight
        layer.register_parameter("weight", weight)
        layer.register_parameter("weight_scale", _param(tuple(scale.shape), torch.float32,
                                                        scale.device))
        layer.weight_scale.data.copy_(scale)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x.is_cuda:
            out = self._apply_cuda(layer, x2)
        else:
            out = self._apply_reference(layer, x2)
        if bias is not None:
            out = out + bias
        return out.view(*shape[:-1], out.shape[-1])

    def _apply_cuda(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        from ...kernels.decode_gemm import DECODE_ROWS, decode_linear
        from ...kernels.fp8_matmul import per_token_quant, w8a16_matmul

        x = x.contiguous()
        scale = layer.weight_scale_inv if self.block is not None else layer.weight_scale
        if x.shape[0] <= DECODE_ROWS:  # the fastest skinny GEMM for the shape (split-K or not)
            return decode_linear(x, layer.weight, None, scale, self.block)
        if self.block is not None or x.shape[0] <= SMALL_BATCH_ROWS:
            return w8a16_matmul(x, layer.weight, scale, self.block)
        q, scale = per_token_quant(x)
        return torch._scaled_mm(q, layer.weight.t(), scale_a=scale,
                                scale_b=layer.weight_scale.view(1, -1), out_dtype=x.dtype)

    def _apply_reference(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.block is not None:
            w = dequantize(layer.weight, layer.weight_scale_inv, self.block)
            return F.linear(x.float(), w).to(x.dtype)
        w = dequantize(layer.weight, layer.weight_scale)
        return F.linear(fake_quant_rows(x), w).to(x.dtype)


class Fp8MoEMethod(MoEMethod):
    """Experts in fp8: ``w13``/``w2`` fp8 with per-channel scales ``[E, 2I]``/``[E, H]``, or
    block scales ``[E, 2I/bn, H/bk]``/``[E, H/bn, I/bk]``. The fused kernel widens them in
    registers; the CPU reference dequantizes the experts a batch uses."""

    def __init__(self, config: QuantConfig) -> None:
        self.block = config.weight_block_size

    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, inter: int,
                       dtype: torch.dtype, device) -> None:
        layer.w13_weight = _param((num_experts, 2 * inter, hidden), FP8_DTYPE, device)
        layer.w2_weight = _param((num_experts, hidden, inter), FP8_DTYPE, device)
        nan = float("nan")
        if self.block is None:
            layer.w13_weight_scale = _param((num_experts, 2 * inter), torch.float32, device, nan)
            layer.w2_weight_scale = _param((num_experts, hidden), torch.float32, device, nan)
            return
        bn, bk = self.block
        if inter % bn or inter % bk:
            raise ModelLoadError(f"expert intermediate size per rank {inter} is not a multiple "
                                 f"of the weight block {self.block}")
        layer.w13_weight_scale = _param((num_experts, 2 * inter // bn, _blocks(hidden, bk)),
                                        torch.float32, device, nan)
        layer.w2_weight_scale = _param((num_experts, _blocks(hidden, bn), inter // bk),
                                       torch.float32, device, nan)

    def load_expert(self, layer: nn.Module, expert: int, shard: str, kind: str,
                    tensor: Any) -> None:
        from ..moe.method import expert_rows

        if kind == "input_scale":
            return  # activations are never quantized statically here
        if kind == "weight":
            target = expert_rows(layer, layer.w13_weight, layer.w2_weight, expert, shard)
            _check_shape(f"experts.{expert}.{shard}", tensor, target.source)
            part = target.slice(tensor)  # this rank's slice only
            if part.dtype == FP8_DTYPE:
                target.dest.copy_(part)
                return
            # a bf16 expert (--quantization fp8): quantized here, one expert at a time, so the
            # bf16 experts never exist on the device all at once
            part = part.to(target.dest.device)
            q, scale = quantize_rows(part) if self.block is None else quantize_blocks(part, self.block)
            target.dest.copy_(q)
            self._scale_dest(layer, expert, shard).copy_(scale)
            return
        if kind not in ("weight_scale", "weight_scale_inv"):
            raise ModelLoadError(f"unknown expert tensor kind {kind!r}")
        scale = materialize(tensor).float()
        if self.block is None and shard == "down":
            dest = self._scale_dest(layer, expert, shard)
            dest.copy_(scale.reshape(-1).expand(dest.shape[0]))
            return
        target = expert_rows(layer, layer.w13_weight_scale, layer.w2_weight_scale, expert, shard)
        if self.block is None:  # per-tensor or per-channel: one value per output row
            scale = scale.reshape(-1).expand(target.source)
        _check_shape(f"experts.{expert}.{shard}.{kind}", scale, target.source)
        target.dest.copy_(target.slice(scale))

    def _scale_dest(self, layer: nn.Module, expert: int, shard: str) -> torch.Tensor:
        from ..moe.method import expert_rows

        if self.block is None and shard == "down":
            # per output row (hidden), which the column split of w2 leaves whole
            return layer.w2_weight_scale.data[expert]
        return expert_rows(layer, layer.w13_weight_scale, layer.w2_weight_scale, expert,
                           shard).dest

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, sum_experts: bool = True) -> torch.Tensor:
        if x.is_cuda:
            from ...kernels.fused_moe import fused_moe

            return fused_moe(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids,
                             layer.w13_weight_scale, layer.w2_weight_scale, self.block,
                             sum_experts=sum_experts)
        from ..moe.reference import moe_reference

        def weights(e: int) -> tuple[torch.Tensor, torch.Tensor]:
            return (dequantize(layer.w13_weight[e], layer.w13_weight_scale[e], self.block),
                    dequantize(layer.w2_weight[e], layer.w2_weight_scale[e], self.block))

        return moe_reference(x, weights, topk_weights, topk_ids)

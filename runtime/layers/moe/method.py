"""Unquantized expert weights: ``w13`` [E, 2I, H] (gate rows, then up rows) and ``w2`` [E, H, I]
in the model dtype, each rank holding its slice of the intermediate dim (of its own experts,
under expert parallelism: E is then the rank's local expert count)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...kernels.dispatch import use_triton
from ..quantization.base import MoEMethod, _check_shape
from ..weight_slices import materialize, narrow
from .reference import moe_reference


class UnquantizedMoEMethod(MoEMethod):
    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, inter: int,
                       dtype: torch.dtype, device: torch.device | str | None) -> None:
        layer.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden, dtype=dtype,
                                                    device=device), requires_grad=False)
        layer.w2_weight = nn.Parameter(torch.empty(num_experts, hidden, inter, dtype=dtype,
                                                   device=device), requires_grad=False)
        # Whole-tensor loading (dummy weights draw the tp_size-1 tensors and keep a slice):
        # full w13 is [E, 2 * I * tp, H] (all gate rows, then all up rows), full w2 [E, H, I * tp].
        # Under expert parallelism the full tensors hold every expert (``layer.num_experts``);
        # this rank keeps its own (``FusedMoE.load_expert`` skips the others).
        size, every = layer.tp_size, layer.num_experts
        layer.w13_weight.full_shape = (every, 2 * inter * size, hidden)
        layer.w2_weight.full_shape = (every, hidden, inter * size)
        layer.w13_weight.weight_loader = lambda p, full: _load_w13(layer, p, full)
        layer.w2_weight.weight_loader = lambda p, full: _load_w2(layer, p, full)

    def load_expert(self, layer: nn.Module, expert: int, shard: str, kind: str,
                    tensor: Any) -> None:
        if kind != "weight":
            raise ValueError(f"unquantized experts have no {kind}")
        target = expert_rows(layer, layer.w13_weight, layer.w2_weight, expert, shard)
        _check_shape(f"experts.{expert}.{shard}", tensor, target.source)
        target.dest.copy_(target.slice(tensor))

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, sum_experts: bool = True) -> torch.Tensor:
        if use_triton(x):
            from ...kernels.fused_moe import fused_moe

            return fused_moe(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids,
                             sum_experts=sum_experts)
        return moe_reference(x, lambda e: (layer.w13_weight[e], layer.w2_weight[e]),
                             topk_weights, topk_ids)


def _load_w13(layer: nn.Module, param: torch.Tensor, full: torch.Tensor) -> None:
    """A whole w13 (every expert's gate rows, then up rows), through ``load_expert``."""
    _check_shape("w13_weight", full, param.full_shape)
    half = full.shape[1] // 2
    for e in range(full.shape[0]):
        layer.load_expert(e, "gate", "weight", full[e, :half])
        layer.load_expert(e, "up", "weight", full[e, half:])


def _load_w2(layer: nn.Module, param: torch.Tensor, full: torch.Tensor) -> None:
    _check_shape("w2_weight", full, param.full_shape)
    for e in range(full.shape[0]):
        layer.load_expert(e, "down", "weight", full[e])


class ShardTarget:
    """Where one expert's checkpoint tensor (full, all ranks' columns) lands on this rank:
    ``dest`` (a view of our parameter), ``source`` (expected full shape) and ``slice``."""

    def __init__(self, dest: torch.Tensor, source: tuple[int, ...], dim: int, start: int,
                 size: int) -> None:
        self.dest, self.source, self.dim, self.start, self.size = dest, source, dim, start, size

    def slice(self, tensor: Any) -> torch.Tensor:
        """This rank's part of ``tensor`` (a lazy safetensors view reads only those bytes)."""
        return materialize(narrow(tensor, self.dim, self.start, self.size))


def expert_rows(layer: nn.Module, w13: torch.Tensor, w2: torch.Tensor, expert: int,
                shard: str) -> ShardTarget:
    """This rank's part of ``shard`` (gate/up: rows of w13, split by rows; down: w2, split by
    columns). Works for weights and for their scales alike (block scales are sliced in blocks,
    per-channel scales ``[E, 2I]``/``[E, H]`` have no column dim to split)."""
    rank, size = layer.tp_rank, layer.tp_size
    if shard in ("gate", "up"):
        half = w13.shape[1] // 2
        dest = w13.data[expert, :half] if shard == "gate" else w13.data[expert, half:]
        full = (half * size, *w13.shape[2:])
        return ShardTarget(dest, full, 0, rank * half, half)
    if shard == "down":
        cols = w2.shape[2]
        return ShardTarget(w2.data[expert], (w2.shape[1], cols * size), 1, rank * cols, cols)
    raise ValueError(f"unknown expert shard {shard!r}; expected gate, up or down")

"""Linear layers whose weights live in one contiguous matrix, including packed projections
(q|k|v, gate|up) that checkpoints store as separate tensors and we fuse at load time.

Weights are allocated with ``torch.empty`` (no init): the loader overwrites every value, and
``dummy`` loading fills them with random numbers once, so default init would be wasted work.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device),
                                   requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype, device=device),
                                  requires_grad=False) if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def use_column_major(self) -> None:
        """Keep the logical ``[out, in]`` shape but lay the weight out as ``[in, out]`` in
        memory. NOTE: on CPU, MKL's matrix-vector product over a row-major ``[out, in]``
        weight (``x @ W.T`` with a transposed operand) reaches about half the memory bandwidth
        of the non-transposed form; decode is bandwidth-bound, so this is ~2x on big matrices."""
        self.weight.data = column_major(self.weight.data)


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """Same values and shape, with ``weight.t()`` contiguous."""
    return weight.t().contiguous().t()


class PackedLinear(Linear):
    """Several projections of the same input stacked along the output dim. ``shards`` names
    each part and its size, e.g. ``{"q": 576, "k": 192, "v": 192}``."""

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool = False, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__(in_features, sum(shards.values()), bias, dtype=dtype, device=device)
        self.offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shards.items():
            self.offsets[name] = (start, size)
            start += size

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor) -> None:
        """Copy a checkpoint tensor (``weight`` or ``bias``) into its rows of the packed param."""
        start, size = self.offsets[shard]
        param = getattr(self, param_name)
        if param is None or tensor.shape[0] != size or tensor.shape[1:] != param.shape[1:]:
            raise ModelLoadError(
                f"shard {shard}.{param_name}: checkpoint shape {tuple(tensor.shape)} does not fit "
                f"rows {start}:{start + size} of packed {tuple(param.shape) if param is not None else None}")
        param.data[start:start + size].copy_(tensor)

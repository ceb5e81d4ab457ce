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
        if self.weight.dim() == 3:  # CPU split layout, see use_cpu_layout
            out = split_matmul(x, self.weight)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)

    def use_cpu_layout(self, splits: int) -> None:
        """Re-lay the weight for CPU matrix-vector products (decode is memory-bound).

        NOTE: two measured effects on the 2-core AMD/MKL machine: (1) MKL's gemv over the
        row-major ``[out, in]`` weight (``x @ W.T``) streams at about half the bandwidth of the
        non-transposed form, so the weight is stored ``[in, out]``; (2) a single gemv uses one
        core, so with ``splits`` > 1 threads the output columns are cut into ``splits`` blocks
        and run as one batched matmul that MKL spreads over the threads (~1.5x on big
        matrices). After this the weight is ``[splits, in, out // splits]`` (3-D)."""
        self.weight.data = cpu_layout(self.weight.data, splits)


def cpu_layout(weight: torch.Tensor, splits: int) -> torch.Tensor:
    """``[out, in]`` -> ``[splits, in, out // splits]`` contiguous (1 split if it does not divide)."""
    out_features, in_features = weight.shape
    if splits < 1 or out_features % splits:
        splits = 1
    return (weight.t().reshape(in_features, splits, out_features // splits)
            .permute(1, 0, 2).contiguous())


def split_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [m, in]`` times a ``cpu_layout`` weight -> ``[m, out]``."""
    splits, in_features, block = weight.shape
    if splits == 1:
        return torch.matmul(x, weight[0])
    out = torch.bmm(x.expand(splits, *x.shape), weight)  # [splits, m, block]
    # For m == 1 this is a view; for prefill it is one copy of the output.
    return out.transpose(0, 1).reshape(x.shape[0], splits * block)


def split_matvec(x: torch.Tensor, weight: torch.Tensor, kernels) -> torch.Tensor:
    """``split_matmul`` for a few fp32 rows ``x [m, in]`` through the C kernel
    (``layers/cpu_kernels.py``), which streams the weight faster than MKL's gemm at small m."""
    splits, in_features, block = weight.shape
    x = x.contiguous()
    out = torch.empty(x.shape[0], splits * block, dtype=torch.float32)
    kernels.matvec(x.data_ptr(), x.shape[0], weight.data_ptr(), out.data_ptr(), splits,
                   in_features, block)
    return out


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
        param.data[start:start + size].copy_(tensor)  # only before use_cpu_layout

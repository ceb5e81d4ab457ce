"""Linear layers, tensor-parallel (shared interface: /work/team/PARALLEL_LAYERS.md).

- ``ColumnParallelLinear``: the output dim is split over the TP ranks (no communication).
- ``MergedColumnParallelLinear``: several projections of one input stacked along the output dim
  (gate|up), each split over the ranks; checkpoints store them separately, we fuse at load time.
- ``QKVParallelLinear``: q|k|v with heads split; kv heads are replicated when there are more
  ranks than kv heads (rank r holds kv head ``r // (tp_size // num_kv_heads)``).
- ``RowParallelLinear``: the input dim is split; the partial products are all-reduced.
- ``ReplicatedLinear`` (alias ``Linear``): every rank holds the whole weight.

Every layer's parameters are created by its ``LinearMethod`` (``layers/quantization``) at this
rank's shapes and carry ``weight_loader(param, full_tensor, shard_id=None)``: it takes the FULL
checkpoint tensor, or a lazily-sliced safetensors view, and copies only this rank's slice, so no
rank materializes the full model. At tp_size 1 every layer computes what a plain linear does.

Weights are allocated with ``torch.empty`` (no init): the loader overwrites every value, and
``dummy`` loading fills them with random numbers once, so default init would be wasted work.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..distributed.collectives import all_gather, all_reduce, all_reduce_add_rmsnorm
from ..distributed.state import get_tp_group
from ..errors import ModelLoadError
from .quantization.base import QuantConfig, linear_method
from .weight_slices import copy_checked, narrow, shape_of

Device = torch.device | str | None


class LinearBase(nn.Module):
    """Common part: sizes (full and per rank), the quant method and the generic loader, which
    slices dims marked ``output_dim`` (when ``split_output``) / ``input_dim`` (``split_input``)."""

    split_output = False
    split_input = False

    def __init__(self, input_size: int, output_size: int, bias: bool, *, in_per_rank: int,
                 out_per_rank: int, quant: QuantConfig | None = None,
                 dtype: torch.dtype | None = None, device: Device = None) -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.size
        self.input_size, self.output_size = input_size, output_size
        self.in_features, self.out_features = in_per_rank, out_per_rank  # this rank's shapes
        self.quant = quant
        self.quant_method = linear_method(quant, self)
        self.quant_method.create_weights(self, in_per_rank, out_per_rank, dtype, device)
        if bias:
            size = out_per_rank if self.split_output else output_size
            self.bias = nn.Parameter(torch.empty(size, dtype=dtype, device=device),
                                     requires_grad=False)
            self.bias.output_dim, self.bias.input_dim = 0, None
            self.bias.full_shape = (output_size,)
        else:
            self.register_parameter("bias", None)
        self.weight.full_shape = (output_size, input_size)
        for param in self.parameters(recurse=False):
            param.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: str | None = None) -> None:
        loaded = self.quant_method.adapt_checkpoint_tensor(self, param, loaded, self.output_size)
        for dim, split in ((getattr(param, "output_dim", None), self.split_output),
                           (getattr(param, "input_dim", None), self.split_input)):
            if split and dim is not None:
                size = param.shape[dim]
                loaded = narrow(loaded, dim, self.tp_rank * size, size)
        copy_checked(param.data, loaded, f"{type(self).__name__} rank {self.tp_rank}")

    def process_weights_after_loading(self) -> None:
        self.quant_method.process_weights_after_loading(self)

    def use_cpu_layout(self, splits: int) -> None:
        """Re-lay the weight for CPU matrix-vector products (decode is memory-bound).

        NOTE: two measured effects on the 2-core AMD/MKL machine: (1) MKL's gemv over the
        row-major ``[out, in]`` weight (``x @ W.T``) streams at about half the bandwidth of the
        non-transposed form, so the weight is stored ``[in, out]``; (2) a single gemv uses one
        core, so with ``splits`` > 1 threads the output columns are cut into ``splits`` blocks
        and run as one batched matmul that MKL spreads over the threads (~1.5x on big
        matrices). After this the weight is ``[splits, in, out // splits]`` (3-D)."""
        self.weight.data = cpu_layout(self.weight.data, splits)

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.quant_method.apply(self, x, bias)


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 quant: QuantConfig | None = None, dtype: torch.dtype | None = None,
                 device: Device = None) -> None:
        super().__init__(in_features, out_features, bias, in_per_rank=in_features,
                         out_per_rank=out_features, quant=quant, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x, self.bias)


Linear = ReplicatedLinear


class ColumnParallelLinear(LinearBase):
    split_output = True

    def __init__(self, input_size: int, output_size: int, bias: bool = False, *,
                 gather_output: bool = False, quant: QuantConfig | None = None,
                 dtype: torch.dtype | None = None, device: Device = None,
                 out_per_rank: int | None = None) -> None:
        tp_size = get_tp_group().size
        if out_per_rank is None:
            out_per_rank = _divide(output_size, tp_size, type(self).__name__)
        self.gather_output = gather_output
        super().__init__(input_size, output_size, bias, in_per_rank=input_size,
                         out_per_rank=out_per_rank, quant=quant, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._matmul(x, self.bias)
        return all_gather(out, -1) if self.gather_output else out


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Projections of the same input stacked along the output dim. ``sizes`` names each part
    and its FULL size (``{"gate": 14336, "up": 14336}``; a list names them 0, 1, ...); every
    rank holds its slice of each part, stacked in the same order."""

    def __init__(self, input_size: int, sizes: list[int] | dict[str, int], bias: bool = False, *,
                 quant: QuantConfig | None = None, dtype: torch.dtype | None = None,
                 device: Device = None) -> None:
        full = dict(enumerate(sizes)) if isinstance(sizes, list) else dict(sizes)
        tp = get_tp_group()
        local = self._local_sizes(full, tp.size)
        self.full_sizes = full
        # shard -> (first row of this rank's slice in the shard, rows): the checkpoint slice
        self.shard_slices = {k: (self._shard_rank(k, tp) * n, n) for k, n in local.items()}
        self.offsets: dict[Any, tuple[int, int]] = {}  # shard -> (row in our param, rows)
        start = 0
        for name, size in local.items():
            self.offsets[name] = (start, size)
            start += size
        super().__init__(input_size, sum(full.values()), bias, quant=quant, dtype=dtype,
                         device=device, out_per_rank=start)

    def _local_sizes(self, full: dict[Any, int], tp_size: int) -> dict[Any, int]:
        return {k: _divide(n, tp_size, f"{type(self).__name__} shard {k}") for k, n in full.items()}

    def _shard_rank(self, shard: Any, tp: Any) -> int:
        return tp.rank

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shard_id is None:  # the whole packed tensor (dummy init): part by part
            start = 0
            for name, size in self.full_sizes.items():
                self.weight_loader(param, narrow(loaded, 0, start, size), name)
                start += size
            return
        dim = getattr(param, "output_dim", None)
        if dim is None:  # not split over rows (a per-tensor scale): whole
            copy_checked(param.data, loaded, f"shard {shard_id}")
            return
        loaded = self.quant_method.adapt_checkpoint_tensor(self, param, loaded,
                                                           self.full_sizes[shard_id])
        # block-wise quantization scales: one row per ``row_block`` weight rows
        unit = getattr(param, "row_block", 1)
        row, size = self.offsets[shard_id][0] // unit, -(-self.offsets[shard_id][1] // unit)
        first, rows = self.shard_slices[shard_id][0] // unit, -(-self.shard_slices[shard_id][1] // unit)
        full = -(-self.full_sizes[shard_id] // unit)
        name = f"shard {shard_id}.{_param_name(self, param)}"
        if unit > 1 and self.offsets[shard_id][0] % unit:
            raise ModelLoadError(f"{name}: shard rows are not aligned to the {unit}-row blocks")
        if shape_of(loaded)[dim] != full:
            raise ModelLoadError(f"{name}: checkpoint shape {shape_of(loaded)} does not fit "
                                 f"rows {row}:{row + size} of packed {tuple(param.shape)}")
        copy_checked(param.data.narrow(dim, row, size), narrow(loaded, dim, first, rows), name)

    def load_shard(self, shard: Any, param_name: str, tensor: Any) -> None:
        """Copy a checkpoint tensor (``weight`` or ``bias``) into its rows of the packed param."""
        param = getattr(self, param_name)
        if param is None:
            raise ModelLoadError(f"shard {shard}.{param_name}: the layer has no {param_name}")
        self.weight_loader(param, tensor, shard)


PackedLinear = MergedColumnParallelLinear


class QKVParallelLinear(MergedColumnParallelLinear):
    """q|k|v: ``num_heads`` split over the ranks; ``num_kv_heads`` split too, or replicated
    (one kv head per rank) when tp_size > num_kv_heads."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False, *, quant: QuantConfig | None = None,
                 dtype: torch.dtype | None = None, device: Device = None) -> None:
        tp_size = get_tp_group().size
        check_heads(num_heads, num_kv_heads, tp_size)
        self.head_dim = head_dim
        self.num_heads, self.num_kv_heads = local_heads(num_heads, num_kv_heads, tp_size)
        super().__init__(hidden_size, {"q": num_heads * head_dim, "k": num_kv_heads * head_dim,
                                       "v": num_kv_heads * head_dim}, bias, quant=quant,
                         dtype=dtype, device=device)

    def _local_sizes(self, full: dict[Any, int], tp_size: int) -> dict[Any, int]:
        kv = self.num_kv_heads * self.head_dim
        return {"q": self.num_heads * self.head_dim, "k": kv, "v": kv}

    def _shard_rank(self, shard: Any, tp: Any) -> int:
        if shard == "q":
            return tp.rank
        total_kv = self.full_sizes["k"] // self.head_dim
        return tp.rank // max(1, tp.size // total_kv)  # replicas of one kv head are neighbours


class RowParallelLinear(LinearBase):
    split_input = True

    def __init__(self, input_size: int, output_size: int, bias: bool = False, *,
                 reduce_results: bool = True, quant: QuantConfig | None = None,
                 dtype: torch.dtype | None = None, device: Device = None) -> None:
        in_per_rank = _divide(input_size, get_tp_group().size, type(self).__name__)
        self.reduce_results = reduce_results
        super().__init__(input_size, output_size, bias, in_per_rank=in_per_rank,
                         out_per_rank=output_size, quant=quant, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._matmul(x, self.bias)
        out = self._matmul(x, None)
        if self.reduce_results:
            out = all_reduce(out)
        return out if self.bias is None else out + self.bias  # added once, after the sum

    def defers(self, x: torch.Tensor) -> bool:
        """Whether ``partial`` + ``reduce_add_rmsnorm`` may stand in for ``norm(self(x), r)``:
        TP, no bias to add after the sum. (On the CPU both compute the same thing: the sum,
        then the norm; CPU TP tests run this path.)"""
        return self.tp_size > 1 and self.reduce_results and self.bias is None

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the product, not yet summed over the ranks."""
        return self._matmul(x, None)

    def forward_add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, norm: Any
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``norm(self(x), residual)`` (an RMSNorm with its residual add): under TP, the
        all-reduce, the add and the norm run as one kernel where the custom all-reduce can."""
        if self.defers(x):
            return reduce_add_rmsnorm(self.partial(x), residual, norm)
        return norm(self(x), residual)


def reduce_add_rmsnorm(partial: torch.Tensor, residual: torch.Tensor, norm: Any
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``norm(all_reduce(partial), residual)``: one kernel where the custom all-reduce fuses
    it, else the all-reduce and then the norm."""
    fused = all_reduce_add_rmsnorm(partial, residual, norm.weight, norm.eps)
    return fused if fused is not None else norm(all_reduce(partial), residual)


def check_heads(num_heads: int, num_kv_heads: int, tp_size: int) -> None:
    """The head split SGLang supports: heads divide evenly; kv heads divide or are replicated."""
    if num_heads % tp_size:
        raise ModelLoadError(f"tp_size={tp_size} does not divide the model's {num_heads} "
                             f"attention heads; use a tp_size that divides {num_heads}")
    if num_kv_heads % tp_size and tp_size % num_kv_heads:
        raise ModelLoadError(f"tp_size={tp_size} and the model's {num_kv_heads} kv heads: one "
                             "must divide the other (kv heads are split or replicated)")


def local_heads(num_heads: int, num_kv_heads: int, tp_size: int) -> tuple[int, int]:
    """(q heads, kv heads) of one rank."""
    return num_heads // tp_size, max(1, num_kv_heads // tp_size)


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


def _divide(n: int, parts: int, what: str) -> int:
    if n % parts:
        raise ModelLoadError(f"{what}: size {n} is not divisible by tp_size={parts}")
    return n // parts


def _param_name(module: nn.Module, param: nn.Parameter) -> str:
    return next((k for k, p in module.named_parameters(recurse=False) if p is param), "param")

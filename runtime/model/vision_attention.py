"""Bidirectional attention within the ragged segments (windows, or whole frames) of a packed
``[tokens, heads, dim]`` sequence, for vision towers (Qwen2.5-VL's window and full attention).

Two ways, picked once per forward by ``Segments.of``:

- GPU, half precision: ONE varlen flash-attention call per layer over the segments'
  ``cu_seqlens`` (the segments are contiguous in the packed order), whatever the mix of
  lengths: no gather of q/k/v by segment length, no scatter back, one launch. A 1280x720 image
  has windows of 64, 32 and 16 patches; the per-length path below launched three SDPA calls per
  window layer plus four index kernels over the whole activations (~20 KB a token a layer).
- Elsewhere (CPU, fp32): one SDPA call per segment length on the length group's tokens
  (``index``), so each segment attends only to itself, as HF's per-segment loop does, without a
  mask (a padded batch needs one, which rules flash out).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layers.upload import to_device

_HALF = (torch.float16, torch.bfloat16)
logger = logging.getLogger(__name__)


def varlen_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Flash attention's varlen kernel takes this device and dtype (fp16/bf16 on a GPU where
    a probe call runs)."""
    if device.type != "cuda" or dtype not in _HALF:
        return False
    return _varlen_runs(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _varlen_runs(index: int) -> bool:
    """One tiny varlen call (once per device): a torch build without flash attention, or an
    older GPU, falls back to the per-length SDPA path instead of failing the encoder."""
    device = torch.device("cuda", index)
    try:
        q = torch.ones(4, 1, 8, device=device, dtype=torch.bfloat16)
        cu = torch.arange(0, 5, 2, device=device, dtype=torch.int32)
        torch.ops.aten._flash_attention_forward(q, q, q, cu, cu, 2, 2, 0.0, False, False,
                                                scale=1.0)
        return True
    except (AttributeError, RuntimeError, TypeError, NotImplementedError) as exc:
        logger.warning("vision attention: no varlen flash attention on %s (%s); one SDPA "
                       "call per segment length instead", device, exc)
        return False


@dataclass(frozen=True)
class Segments:
    """The segments of one packed sequence: ``cu`` (int32 ``[n + 1]`` offsets on the device)
    and ``max_len`` for the varlen path, or ``groups`` (token index of each length's segments,
    segment after segment, None: all tokens; and the length) for the per-length path. Built
    once per forward and shared by the blocks of that kind."""

    groups: tuple[tuple[torch.Tensor | None, int], ...]
    cu: torch.Tensor | None = None
    max_len: int = 0

    @classmethod
    def of(cls, lens: torch.Tensor, device: torch.device, varlen: bool) -> "Segments":
        """``lens``: the segments' token counts, in packed order (host tensor)."""
        lens = lens.cpu()
        if varlen:
            cu = torch.zeros(lens.numel() + 1, dtype=torch.int32)
            torch.cumsum(lens, 0, out=cu[1:])
            return cls((), to_device(cu, device), int(lens.max()))
        if bool((lens == lens[0]).all()):  # one group: the packed sequence itself
            return cls(((None, int(lens[0])),))
        starts = torch.cumsum(lens, 0) - lens
        groups = []
        for length in torch.unique(lens).tolist():
            first = starts[lens == length]
            index = (first[:, None] + torch.arange(length)).flatten()
            groups.append((to_device(index, device), int(length)))
        return cls(tuple(groups))


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segs: Segments,
                      scale: float) -> torch.Tensor:
    """Attention within each segment of ``[tokens, heads, dim]`` tensors (rows may be strided;
    the last dim contiguous); returns ``[tokens, heads, dim]``."""
    if segs.cu is not None:
        # NOTE: aten's flash forward with cum_seq_* is its varlen entry (what nested-tensor
        # SDPA and torch.nn.attention.varlen call); positional up to return_debug_mask, the
        # same in every torch release that has it
        return torch.ops.aten._flash_attention_forward(
            q, k, v, segs.cu, segs.cu, segs.max_len, segs.max_len, 0.0, False, False,
            scale=scale)[0]
    heads, dim = q.shape[1:]

    def attend(qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, length: int) -> torch.Tensor:
        qg, kg, vg = (t.reshape(-1, length, heads, dim).transpose(1, 2) for t in (qg, kg, vg))
        out = F.scaled_dot_product_attention(qg, kg, vg, scale=scale)
        return out.transpose(1, 2).reshape(-1, heads, dim)

    if segs.groups[0][0] is None:
        return attend(q, k, v, segs.groups[0][1])
    out = torch.empty_like(q)
    for index, length in segs.groups:
        out[index] = attend(q[index], k[index], v[index], length)
    return out

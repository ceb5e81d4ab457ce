"""FP8 (E4M3) quantization math in plain torch: the load-time quantizer, the CPU reference
products, and the fallbacks of the GPU kernels. Scales are float32 and multiply the fp8 values
back (``x ~= q * scale``)."""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# NOTE: a row of zeros would get scale 0 and 0/0 = NaN; the floor keeps it finite.
_MIN_SCALE = 1e-12


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (per output channel / per token) symmetric scales: ``(q [R, C] fp8, scale [R])``."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / FP8_MAX).clamp_min(_MIN_SCALE)
    q = (xf / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise scales as published checkpoints store them: ``(q [N, K], scale [ceil(N/bn),
    ceil(K/bk)])`` (used by tests to build such checkpoints)."""
    bn, bk = block
    n, k = w.shape
    pad = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk, dtype=torch.float32, device=w.device)
    pad[:n, :k] = w.float()
    tiles = pad.view(pad.shape[0] // bn, bn, pad.shape[1] // bk, bk)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(_MIN_SCALE)
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view_as(pad)[:n, :k]
    return q.to(FP8_DTYPE).contiguous(), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor,
               block: tuple[int, int] | None = None) -> torch.Tensor:
    """fp32 values of an fp8 matrix ``q [N, K]`` (or ``[E, N, K]``): ``scale`` per row
    (``[N]``), per tensor (0-d) or per block (``[ceil(N/bn), ceil(K/bk)]``)."""
    qf = q.float()
    if block is None:
        return qf * (scale.float().unsqueeze(-1) if scale.dim() else scale.float())
    bn, bk = block
    n, k = q.shape[-2:]
    full = scale.float().repeat_interleave(bn, dim=-2).repeat_interleave(bk, dim=-1)
    return qf * full[..., :n, :k]


def fake_quant_rows(x: torch.Tensor) -> torch.Tensor:
    """x after a per-row fp8 round trip (the dynamic per-token activation quantization of the
    GPU path, for the CPU reference)."""
    q, scale = quantize_rows(x.reshape(-1, x.shape[-1]))
    return (q.float() * scale.unsqueeze(-1)).view(x.shape)

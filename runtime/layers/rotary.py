"""Rotary position embedding (neox / rotate-half layout, as in HF Llama and Qwen).

The cos/sin table is computed once for every position up to the context length; a forward
looks up its positions once (``lookup``) and every layer reuses the result (``apply``).
Scaling: ``default``, ``linear`` (positions / factor) and ``llama3`` (frequency-dependent).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..kernels.dispatch import use_triton
from ..model.model_config import RopeScaling


def inv_frequencies(head_dim: int, base: float, scaling: RopeScaling) -> torch.Tensor:
    """fp32 inverse frequencies ``[head_dim // 2]`` after scaling."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.rope_type == "linear":
        return inv / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3(inv, scaling)
    return inv


def _llama3(inv: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by ``factor``, short ones kept, and the band
    # between is interpolated smoothly (same formula as Meta's reference code).
    old_len = s.original_max_position_embeddings or 8192
    low_wavelen = old_len / s.low_freq_factor
    high_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float, scaling: RopeScaling, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        inv = inv_frequencies(head_dim, base, scaling)
        if str(device) == "meta":
            cos = sin = torch.empty(max_position, head_dim, dtype=dtype, device="meta")
        else:
            freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)  # both halves rotate by the same angle
            cos, sin = emb.cos(), emb.sin()
            # NOTE: the first half of sin is stored negated, so ``apply`` needs no negation.
            sin[:, : head_dim // 2].neg_()
            cos, sin = cos.to(dtype), sin.to(dtype)
        # Buffers so .to(device) moves them; not saved: they are derived, not weights.
        # ``sin_cache`` holds the signed sin: [-sin, sin] over the two halves.
        self.register_buffer("cos_cache", cos.to(device) if device else cos, persistent=False)
        self.register_buffer("sin_cache", sin.to(device) if device else sin, persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (first half negated) for ``positions`` as
        ``[num_tokens, 1, head_dim]``, broadcast over heads."""
        return (self.cos_cache.index_select(0, positions).unsqueeze(1),
                self.sin_cache.index_select(0, positions).unsqueeze(1))

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [num_tokens, num_heads, head_dim]`` (neox layout: ``x*cos + rotate_half(x)*sin``
        with ``rotate_half(x) = [-x2, x1]``); returns a new contiguous tensor."""
        if use_triton(x):  # GPU path (issue 6): one kernel instead of three
            from ..kernels.rotary import rotary_apply_gathered

            return rotary_apply_gathered(x, cos, signed_sin)
        n, heads, dim = x.shape
        # [x1, x2] -> [x2, x1] by flipping the halves axis; the sign lives in signed_sin.
        swapped = x.reshape(n, heads, 2, dim // 2).flip(2).view(n, heads, dim)
        return torch.addcmul(x * cos, swapped, signed_sin)

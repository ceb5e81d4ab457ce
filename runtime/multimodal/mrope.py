"""Qwen2.5-VL's multimodal rotary positions (M-RoPE).

Every token has three positions (time, height, width). Text tokens count up by one in all
three; an image's tokens (its merged patch grid, ``gh x gw``) take ``start`` in time and
``start + row`` / ``start + column``, and the text after it resumes at ``start + max(gh, gw)``.
The rotary angle of frequency ``i`` uses the position of the section ``i`` falls in
(``mrope_section``, e.g. 16/24/24 of 64 frequencies). A pure-text sequence has three equal rows,
which is the plain 1-D rotary.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .inputs import ImageItem


def prompt_positions(prompt_len: int, images: Sequence[ImageItem],
                     merge: int) -> tuple[torch.Tensor, int]:
    """``([3, prompt_len] int64, delta)``: positions of the prompt's tokens, and what the
    tokens after the prompt add to their index (``max position + 1 - prompt_len``)."""
    parts, pos, cursor = [], 0, 0
    for item in sorted(images, key=lambda i: i.offset):
        text = item.offset - cursor
        parts.append(torch.arange(pos, pos + text).expand(3, text))
        pos += text
        t, h, w = item.grid_thw
        gh, gw = h // merge, w // merge
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw),
                                          indexing="ij")).reshape(3, -1)
        parts.append(grid + pos)
        pos += max(gh, gw)
        cursor = item.offset + item.num_tokens
    tail = prompt_len - cursor
    parts.append(torch.arange(pos, pos + tail).expand(3, tail))
    table = torch.cat(parts, dim=1).to(torch.int64)
    return table, int(table.max()) + 1 - prompt_len


class MRotaryEmbedding(nn.Module):
    """cos / signed sin (``layers.rotary`` layout: ``[tokens, 1, head_dim]``, first half of sin
    negated) for 3-row positions."""

    def __init__(self, head_dim: int, base: float, sections: Sequence[int], *,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        if sum(sections) != head_dim // 2:
            raise ValueError(f"mrope_section {list(sections)} must sum to head_dim/2 = {head_dim // 2}")
        self.dtype = dtype
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        which = torch.repeat_interleave(torch.arange(3), torch.tensor(list(sections)))
        self.register_buffer("inv_freq", inv.to(device), persistent=False)
        self.register_buffer("section", which.to(device), persistent=False)

    def lookup(self, positions3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions3 [3, tokens]`` -> (cos, signed sin), each ``[tokens, 1, head_dim]``."""
        pos = positions3.float().index_select(0, self.section)  # [half, tokens]: its section's row
        freqs = pos.t() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        half = freqs.shape[-1]
        sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        return cos.to(self.dtype).unsqueeze(1), sin.to(self.dtype).unsqueeze(1)


def set_row_deltas(model: nn.Module, reqs: Sequence, rows: torch.Tensor) -> None:
    """Write the requests' M-RoPE deltas into the model's per-row table (Qwen2.5-VL; a no-op
    for other models). A prefill writes them itself; a request that joins decoding without a
    prefill on this server (PD's prebuilt requests) needs this first."""
    table = getattr(getattr(model, "model", None), "row_delta", None)
    if table is None:
        return
    deltas = [r.mm.mrope_delta if getattr(r, "mm", None) is not None else 0 for r in reqs]
    table.index_copy_(0, rows.to(table.device), torch.tensor(deltas, device=table.device))

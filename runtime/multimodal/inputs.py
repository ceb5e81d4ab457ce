"""What a request with images carries to the scheduler (``MmData``), and one prefill batch's
view of it (``MmBatch``, set as ``ForwardBatch.mm_inputs`` by ``build_mm_batch``).

A prompt's image occupies ``num_tokens`` consecutive token positions from ``offset``; those
positions hold ``pad_value`` (derived from the image's pixel hash, outside every vocabulary)
instead of the image token, so the radix cache matches a repeated image and never a different
one. A prefill chunk may cover part of an image: the batch then takes the matching rows of
the image's embedding (``ImageSlice``), so chunking never splits an embedding incorrectly.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from ..layers.upload import to_device
from .pixels import PatchSpec

# NOTE: pad ids live in [PAD_BASE, PAD_BASE + PAD_RANGE): above any vocabulary, below 2**31
# (int32-safe), so they can never equal a text token.
PAD_BASE = 1 << 30
PAD_RANGE = 1 << 29


def pad_value(image_hash: int) -> int:
    return PAD_BASE + image_hash % PAD_RANGE


class _NumpyPickled:
    """Tensor fields pickled as numpy arrays: torch's own tensor pickling goes through
    ``torch.load`` per tensor (~20 ms to unpickle a 1280x720 image's pixels in the scheduler's
    loop, 1.5 ms as numpy)."""

    def __reduce__(self) -> tuple:
        return _rebuild, (type(self), tuple(_pack(getattr(self, f.name)) for f in fields(self)))


def _pack(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    t = value.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
        return _Packed(t.view(torch.int16).numpy(), True)
    return _Packed(t.numpy(), False)


@dataclass(frozen=True)
class _Packed:
    array: np.ndarray
    bf16: bool


def _rebuild(cls: type, values: tuple) -> Any:
    def unpack(v: Any) -> Any:
        if not isinstance(v, _Packed):
            return v
        t = torch.from_numpy(v.array)
        return t.view(torch.bfloat16) if v.bf16 else t

    return cls(*(unpack(v) for v in values))


@dataclass(frozen=True)
class ImageItem(_NumpyPickled):
    """One processed image of a request."""

    # ``uint8 [H, W, 3]`` resized pixels when ``patches`` is set (the encoder's device cuts
    # them: multimodal/pixels.py), else the image processor's output as the encoder takes it
    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]  # patches in time, height, width (Qwen2.5-VL; LLaVA: 1, h, w)
    hash: int  # of the decoded pixels (64 bits)
    offset: int  # first of its token positions in the prompt
    num_tokens: int
    patches: PatchSpec | None = None

    @property
    def pad_value(self) -> int:
        return pad_value(self.hash)

    def encoder_input(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The pixels as the vision encoder takes them, on ``device`` in ``dtype``."""
        pixels = to_device(self.pixel_values, device)  # pinned, non-blocking (layers/upload.py)
        if self.patches is None:
            return pixels.to(dtype)
        return self.patches.to_patches(pixels, dtype)


@dataclass(frozen=True)
class MmData(_NumpyPickled):
    """A request's images, in prompt order, and its M-RoPE positions (Qwen2.5-VL; else None):
    ``[3, prompt_len]`` for the prompt, and ``delta`` for tokens after it (position = index +
    delta in all three rows)."""

    images: tuple[ImageItem, ...]
    mrope_positions: torch.Tensor | None = None
    mrope_delta: int = 0

    @property
    def last_image_token(self) -> int:
        return max(i.offset + i.num_tokens for i in self.images) - 1


@dataclass(frozen=True)
class ImageSlice:
    """Rows ``start:end`` of ``item``'s embedding go to batch rows from ``dst``."""

    item: ImageItem
    start: int
    end: int
    dst: int


@dataclass
class MmBatch:
    slices: list[ImageSlice]
    positions3: torch.Tensor | None  # [3, num_tokens] on the device, or None (no M-RoPE)
    deltas: torch.Tensor | None  # [batch] per-request M-RoPE delta on the device


def _overlaps(mm: MmData, p: int, e: int, offset: int) -> list[ImageSlice]:
    out = []
    for item in mm.images:
        lo, hi = max(item.offset, p), min(item.offset + item.num_tokens, p + e)
        if lo < hi:
            out.append(ImageSlice(item, lo - item.offset, hi - item.offset, offset + lo - p))
    return out


def _positions3(mm: MmData | None, p: int, e: int) -> torch.Tensor:
    """``[3, e]`` positions of tokens ``p:p+e``: the prompt's from its table, later ones (and
    every token of a request without images) index + delta."""
    idx = torch.arange(p, p + e, dtype=torch.int64)
    if mm is None or mm.mrope_positions is None:
        return idx.expand(3, e)
    table = mm.mrope_positions
    inside = table[:, p:min(p + e, table.shape[1])]
    after = idx[inside.shape[1]:] + mm.mrope_delta
    return torch.cat([inside, after.expand(3, after.numel())], dim=1)


def build_mm_batch(reqs: list[Any], device: torch.device) -> MmBatch | None:
    """The batch's image slices and M-RoPE positions; None when no request has images (and
    none needs M-RoPE positions). Requests need ``kv_len``, ``extend_len`` and ``mm``."""
    if all(getattr(r, "mm", None) is None for r in reqs):
        return None
    slices, pos, deltas, offset = [], [], [], 0
    mrope = any(r.mm is not None and r.mm.mrope_positions is not None for r in reqs)
    for req in reqs:
        p, e, mm = req.kv_len, req.extend_len, req.mm
        if mm is not None:
            slices += _overlaps(mm, p, e, offset)
        if mrope:
            pos.append(_positions3(mm, p, e))
        deltas.append(mm.mrope_delta if mm is not None else 0)
        offset += e
    positions3 = to_device(torch.cat(pos, dim=1), device) if mrope else None
    return MmBatch(slices, positions3, to_device(torch.tensor(deltas, dtype=torch.int64), device))


def text_ids(req: Any) -> list[int]:
    """The request's prompt ids without image pad ids (penalties count vocabulary tokens)."""
    if getattr(req, "mm", None) is None:
        return req.origin_input_ids
    return [t for t in req.origin_input_ids if t < PAD_BASE]

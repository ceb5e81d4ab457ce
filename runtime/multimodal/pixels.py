"""Qwen2-VL-style pixels in two halves: the main process only resizes (PIL bicubic, as the
model's own transformers image processor does) and ships ``uint8 [H, W, 3]``; the encoder's
device rescales, normalizes and cuts the patches (``to_patches``).

Why: the processor's full output is ``[patches, 3*2*14*14]`` float32 (22 MB for a 1280x720
image, the temporal axis a duplicate): normalizing and patchifying it on the CPU under the GIL,
then pickling it to the scheduler and back, cost more than the encoder itself. ``uint8`` is
8x smaller and the arithmetic is one fused pass on the device. The numbers are the
processor's: ``PatchSpec.of`` checks the split against the processor on a probe image at load
and returns None (the processor's output is shipped as before) when they differ.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..layers.upload import to_device

_PROBE = (97, 61)  # width, height of the load-time check's image (not a multiple of 28)


@dataclass(frozen=True)
class PatchSpec:
    """The image processor's resize bounds, rescale/normalize constants and patch layout."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    scale: float
    patch: int
    temporal: int
    merge: int
    min_pixels: int
    max_pixels: int
    resample: int

    @classmethod
    def of(cls, processor: Any) -> "PatchSpec | None":
        """The spec of a Qwen2-VL image processor whose output ``to_patches`` reproduces
        (checked on a probe image); None for any other processor."""
        if not all(getattr(processor, k, False) for k in ("do_resize", "do_rescale", "do_normalize")):
            return None
        if not hasattr(processor, "temporal_patch_size") or not hasattr(processor, "merge_size"):
            return None
        size = getattr(processor, "size", None)
        lo = getattr(processor, "min_pixels", None) or _get(size, "shortest_edge")
        hi = getattr(processor, "max_pixels", None) or _get(size, "longest_edge")
        if not lo or not hi:
            return None
        try:  # NOTE: a torchvision-backed processor names its resample mode differently
            spec = cls(tuple(float(v) for v in processor.image_mean),
                       tuple(float(v) for v in processor.image_std), float(processor.rescale_factor),
                       int(processor.patch_size), int(processor.temporal_patch_size),
                       int(processor.merge_size), int(lo), int(hi), int(processor.resample))
        except (TypeError, ValueError, AttributeError):
            return None
        return spec if spec._matches(processor) else None

    def resize(self, image: Any) -> np.ndarray:
        """``uint8 [H, W, 3]`` of an RGB PIL image at the processor's size (multiples of
        ``patch * merge`` within the pixel bounds)."""
        h, w = smart_resize(image.height, image.width, self.patch * self.merge,
                            self.min_pixels, self.max_pixels)
        if (w, h) != image.size:
            image = image.resize((w, h), resample=self.resample)
        return np.array(image, dtype=np.uint8)  # writable: torch.from_numpy shares it

    def grid(self, pixels: torch.Tensor) -> tuple[int, int, int]:
        """``(t, h, w)`` patches of ``uint8 [H, W, 3]`` pixels."""
        return 1, pixels.shape[0] // self.patch, pixels.shape[1] // self.patch

    def to_patches(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``uint8 [H, W, 3]`` (any device) -> ``[h * w, 3 * T * P * P]`` in ``dtype``, as the
        processor computes it: ``float32(float64(x) * scale)``, then ``(x - mean) / std`` in
        float32; patches in merge-block order, each frame repeated ``temporal`` times."""
        c = pixels.shape[2]
        x = (pixels.permute(2, 0, 1).double() * self.scale).float()
        # NOTE: pinned and non-blocking: a tensor built on the device from a list is a
        # pageable copy, which holds the host until the queued forward drains
        mean = to_device(torch.tensor(self.mean, dtype=torch.float32), x.device).view(c, 1, 1)
        std = to_device(torch.tensor(self.std, dtype=torch.float32), x.device).view(c, 1, 1)
        x = ((x - mean) / std).to(dtype)
        _, gh, gw = self.grid(pixels)
        p, m = self.patch, self.merge
        x = x.view(c, gh // m, m, p, gw // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
        x = x.unsqueeze(5).expand(*x.shape[:5], self.temporal, p, p)
        return x.reshape(gh * gw, c * self.temporal * p * p)

    def _matches(self, processor: Any) -> bool:
        from PIL import Image

        rng = np.random.default_rng(0)
        image = Image.fromarray(rng.integers(0, 256, (_PROBE[1], _PROBE[0], 3), dtype=np.uint8))
        try:
            ref = processor(images=[image], return_tensors="pt")["pixel_values"].float()
        except Exception:  # noqa: BLE001 - a processor we do not know how to call
            return False
        try:
            ours = self.to_patches(torch.from_numpy(self.resize(image)), torch.float32)
        except Exception:  # noqa: BLE001 - e.g. a resample mode PIL does not take
            return False
        return ours.shape == ref.shape and bool((ours - ref).abs().max() <= 1e-6)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int
                 ) -> tuple[int, int]:
    """transformers' Qwen2-VL target size: both sides multiples of ``factor``, the area within
    the bounds, the aspect ratio kept as closely as possible (ValueError past 200:1)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio above 200 ({width}x{height})")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def _get(size: Any, key: str) -> Any:
    if size is None:
        return None
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)

"""The main-process image step: each image decoded, hashed and run through the model's own
transformers image processor; each image token of the prompt expanded into the image's
``num_tokens`` positions, holding the image's hash-derived pad id (``inputs.pad_value``);
M-RoPE positions computed for Qwen2.5-VL. The result travels with the request (``MmData``).

A prompt marks an image with the family's placeholder (Qwen2.5-VL:
``<|vision_start|><|image_pad|><|vision_end|>``, LLaVA: ``<image>``); a text prompt without
any gets the placeholders of all its images prepended.
"""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ..errors import InvalidRequestError
from .image_io import decode_image, pixel_hash
from .inputs import ImageItem, MmData
from .mrope import prompt_positions
from .pixels import PatchSpec

PROCESSED_CACHE_BYTES = 256 << 20  # processed pixels of recent images, by pixel hash
_FAMILIES = ("Qwen2_5_VLForConditionalGeneration", "LlavaForConditionalGeneration")


@dataclass(frozen=True)
class ImageFormat:
    """How a model family marks and counts an image's tokens."""

    family: str  # "qwen2_5_vl" | "llava"
    placeholder: str  # what a prompt writes for one image
    image_token: str  # the token expanded into the image's positions
    merge: int = 1  # Qwen2.5-VL: patches per token side
    fixed_tokens: int = 0  # LLaVA: tokens per image whatever its size (0: from the grid)


def image_format(arch: str, hf: Any) -> ImageFormat | None:
    """The format of a transformers config's model family; None for a text-only model."""
    if arch == "Qwen2_5_VLForConditionalGeneration":
        return ImageFormat("qwen2_5_vl", "<|vision_start|><|image_pad|><|vision_end|>",
                           "<|image_pad|>", int(hf.vision_config.spatial_merge_size))
    if arch == "LlavaForConditionalGeneration":
        vision = hf.vision_config
        tokens = (vision.image_size // vision.patch_size) ** 2
        tokens += 1 if hf.vision_feature_select_strategy == "full" else 0
        return ImageFormat("llava", "<image>", "<image>", fixed_tokens=tokens)
    return None


class MultimodalProcessor:
    def __init__(self, model_dir: str | Path, tokenizer: Any, fmt: ImageFormat,
                 allow_urls: bool = False, max_images: int = 16,
                 pixel_dtype: torch.dtype = torch.float32) -> None:
        self.fmt = fmt
        # NOTE: pixels travel to the scheduler in the model's dtype (the encoder casts to it
        # first thing): half the bytes through the pipe for a bf16 model, same numbers.
        self.pixel_dtype = pixel_dtype
        self.image_processor = _load_image_processor(model_dir)
        # the device normalizes and patchifies (multimodal/pixels.py); None: the processor's
        # whole output travels (LLaVA, or a processor the split does not reproduce)
        self.patch_spec = PatchSpec.of(self.image_processor) if fmt.family == "qwen2_5_vl" else None
        self.image_token_id = int(tokenizer.convert_tokens_to_ids(fmt.image_token))
        self.allow_urls = allow_urls
        self.max_images = max_images
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max(2, min(16, (os.cpu_count() or 2))),
                                       thread_name_prefix="sgdsl-images")
        self._processed: OrderedDict[int, tuple[torch.Tensor, tuple[int, int, int]]] = OrderedDict()
        self._bytes = 0
        self.busy_s = 0.0
        self.images_done = 0

    @classmethod
    def for_model(cls, model_dir: str | Path, tokenizer: Any, config: Any
                  ) -> "MultimodalProcessor | None":
        """The processor of a vision-language model directory; None for a text-only model."""
        path = Path(model_dir) / "config.json"
        raw = json.loads(path.read_text()) if path.is_file() else {}
        archs = [a for a in raw.get("architectures") or [] if a in _FAMILIES]
        if not archs:
            return None
        from transformers import AutoConfig

        fmt = image_format(archs[0], AutoConfig.from_pretrained(str(model_dir)))
        proc = cls(model_dir, tokenizer, fmt, config.allow_image_urls,
                   config.max_images_per_request, _pixel_dtype(config))
        # NOTE: drafters read req.all_ids, whose image positions hold pad ids outside the
        # vocabulary (a draft model would embed them): refused until drafters skip them.
        proc.refuse_reason = ("speculative decoding is on; requests with images are not "
                              "supported with it yet"
                              if getattr(config, "speculative_algorithm", None) else None)
        return proc

    def with_placeholders(self, prompt: str, count: int) -> str:
        """``prompt`` with the images' placeholders prepended when it has none."""
        if count and self.fmt.image_token not in prompt:
            return self.fmt.placeholder * count + "\n" + prompt
        return prompt

    refuse_reason: str | None = None

    def check_count(self, images: Sequence[Any], field: str) -> None:
        if images and self.refuse_reason:
            raise InvalidRequestError(f"{field}: {self.refuse_reason}", field=field)
        if len(images) > self.max_images:
            raise InvalidRequestError(f"{field}: {len(images)} images in one request; this server "
                                      f"accepts at most {self.max_images}", field=field)

    def process(self, ids: list[int], images: Sequence[Any], field: str) -> tuple[list[int], MmData]:
        """Prompt ids with each image token expanded, and the request's ``MmData``."""
        self.check_count(images, field)
        marks = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(marks) != len(images):
            raise InvalidRequestError(
                f"{field}: the prompt marks {len(marks)} image(s) ({self.fmt.placeholder!r}) but "
                f"{len(images)} were given", field=field)
        out: list[int] = []
        items: list[ImageItem] = []
        cursor = 0
        for k, (mark, source) in enumerate(zip(marks, images)):
            out += ids[cursor:mark]
            item = self._item(source, len(out), f"{field}[{k}]")
            out += [item.pad_value] * item.num_tokens
            items.append(item)
            cursor = mark + 1
        out += ids[cursor:]
        if self.fmt.family == "qwen2_5_vl":
            table, delta = prompt_positions(len(out), items, self.fmt.merge)
            return out, MmData(tuple(items), table, delta)
        return out, MmData(tuple(items))

    def _item(self, source: Any, offset: int, field: str) -> ImageItem:
        t0 = time.perf_counter()
        image = decode_image(source, field, self.allow_urls)
        key = pixel_hash(image)
        pixels, grid = self._pixels(image, key, field)
        t, h, w = grid
        tokens = t * h * w // (self.fmt.merge ** 2)
        with self._lock:
            self.busy_s += time.perf_counter() - t0
            self.images_done += 1
        return ImageItem(pixels, grid, key, offset, tokens, self.patch_spec)

    def stats(self) -> dict:
        """Seconds spent decoding, hashing and processing images (summed over threads)."""
        return {"mm_preprocess_s": self.busy_s, "mm_images_preprocessed": self.images_done}

    def _pixels(self, image: Any, key: int, field: str) -> tuple[torch.Tensor, tuple[int, int, int]]:
        with self._lock:
            hit = self._processed.get(key)
            if hit is not None:
                self._processed.move_to_end(key)
                return hit
        try:
            pixels, grid = self._run_processor(image)
        except Exception as e:  # noqa: BLE001 - the processor raises many kinds for odd images
            raise InvalidRequestError(f"{field}: the image processor rejected the image "
                                      f"({type(e).__name__}: {e})", field=field) from None
        self._remember(key, (pixels, grid))
        return pixels, grid

    def _run_processor(self, image: Any) -> tuple[torch.Tensor, tuple[int, int, int]]:
        if self.patch_spec is not None:  # resized uint8 only (PIL releases the GIL meanwhile)
            pixels = torch.from_numpy(self.patch_spec.resize(image))
            return pixels, self.patch_spec.grid(pixels)
        out = self.image_processor(images=[image], return_tensors="pt")
        pixels = out["pixel_values"].to(self.pixel_dtype)
        if "image_grid_thw" in out:
            return pixels, tuple(int(v) for v in out["image_grid_thw"][0])
        return pixels, (1, self.fmt.fixed_tokens, 1)  # a fixed-size tower (LLaVA): 1 x n x 1

    def _remember(self, key: int, value: tuple[torch.Tensor, tuple[int, int, int]]) -> None:
        size = value[0].numel() * value[0].element_size()
        with self._lock:
            if key in self._processed or size > PROCESSED_CACHE_BYTES:
                return
            self._processed[key] = value
            self._bytes += size
            while self._bytes > PROCESSED_CACHE_BYTES:
                _, (old, _) = self._processed.popitem(last=False)
                self._bytes -= old.numel() * old.element_size()


def _load_image_processor(model_dir: str | Path) -> Any:
    """The model's transformers image processor, its PIL flavour where there is a choice (the
    reference numbers; ``PatchSpec`` reproduces its resize): transformers 5 names it with
    ``backend="pil"``, 4.x with ``use_fast=False``; either may be ignored or refused."""
    from transformers import AutoImageProcessor

    for kwargs in ({"backend": "pil"}, {"use_fast": False}):
        try:
            proc = AutoImageProcessor.from_pretrained(str(model_dir), **kwargs)
        except Exception:  # noqa: BLE001 - a version that does not take the argument
            continue
        fast = type(proc).__name__.endswith("Fast")
        if not fast and getattr(proc, "backend", "") != "torchvision":
            return proc
    return AutoImageProcessor.from_pretrained(str(model_dir))


def _pixel_dtype(config: Any) -> torch.dtype:
    """The model's dtype as the runner resolves it (auto: bf16 on CUDA, fp32 on CPU)."""
    if config.dtype != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}[config.dtype]
    cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
    return torch.bfloat16 if cuda else torch.float32

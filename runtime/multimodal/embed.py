"""Image embeddings into a prefill batch: the vision encoder runs once per batch on the images
whose rows the batch needs and that the ``EncoderCache`` does not hold, then each
``ImageSlice`` is copied over its token rows of the input embeddings."""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

import torch

from .inputs import ImageItem, MmBatch

Encode = Callable[[Sequence[ImageItem]], list[torch.Tensor]]
DEFAULT_CACHE_BYTES = 512 << 20  # EngineConfig.mm_embedding_cache_bytes replaces it at load


class EncoderTimer:
    """Time in the vision encoder: device time from CUDA events around each call (read
    when ``stats`` asks, from the pairs that have completed: no synchronization), host time
    of the calls on the CPU. ``mm_encode_ms`` in the scheduler's stats."""

    def __init__(self) -> None:
        self.ms = 0.0
        self.patches = 0
        self._pending: list[tuple[Any, Any]] = []

    def run(self, fn: Callable[[], Any], device: torch.device, patches: int) -> Any:
        self.patches += patches
        if device.type != "cuda":
            t0 = time.perf_counter()
            out = fn()
            self.ms += (time.perf_counter() - t0) * 1e3
            return out
        self._drain()  # a server may never ask for stats: keep the pending list short
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        self._pending.append((start, end))
        return out

    def total_ms(self) -> float:
        self._drain()
        return self.ms

    def _drain(self) -> None:
        """Add the completed pairs (in launch order, so stop at the first pending one)."""
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.pop(0)
            self.ms += start.elapsed_time(end)


class EncoderCache:
    """Encoder outputs by image hash, least recently used dropped first past ``max_bytes``.
    NOTE: the radix cache makes most repeats prefix hits that never reach the encoder; this
    cache serves an image split over prefill chunks and one image in several requests of a
    batch (0 bytes: off; every chunk then re-encodes its images)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.timer = EncoderTimer()

    def get(self, key: int) -> torch.Tensor | None:
        emb = self._items.get(key)
        if emb is not None:
            self._items.move_to_end(key)
            self.hits += 1
        else:
            self.misses += 1
        return emb

    def put(self, key: int, emb: torch.Tensor) -> None:
        size = emb.numel() * emb.element_size()
        if size > self.max_bytes or key in self._items:
            return
        self._items[key] = emb
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


def image_embeddings(mm: MmBatch, encode: Encode, cache: EncoderCache) -> dict[int, torch.Tensor]:
    """hash -> embedding ``[num_tokens, hidden]`` for every image the batch's slices name;
    the missing ones encoded together in one call."""
    found: dict[int, torch.Tensor] = {}
    missing: dict[int, ImageItem] = {}
    for s in mm.slices:
        key = s.item.hash
        if key in found or key in missing:
            continue
        emb = cache.get(key)
        if emb is None:
            missing[key] = s.item
        else:
            found[key] = emb
    if missing:
        items = list(missing.values())
        device = mm.deltas.device if mm.deltas is not None else torch.device("cpu")
        patches = sum(i.grid_thw[0] * i.grid_thw[1] * i.grid_thw[2] for i in items)
        for (key, item), emb in zip(missing.items(),
                                    cache.timer.run(lambda: encode(items), device, patches)):
            if emb.shape[0] != item.num_tokens:
                raise RuntimeError(f"image encoder gave {emb.shape[0]} rows for an image of "
                                   f"{item.num_tokens} tokens")
            found[key] = emb
            cache.put(key, emb)
    return found


def splice(embeds: torch.Tensor, mm: MmBatch, encode: Encode, cache: EncoderCache) -> torch.Tensor:
    """``embeds [tokens, hidden]`` with every image slice's rows replaced (in place)."""
    if not mm.slices:
        return embeds
    table = image_embeddings(mm, encode, cache)
    for s in mm.slices:
        rows = table[s.item.hash][s.start:s.end]
        embeds[s.dst:s.dst + rows.shape[0]] = rows.to(embeds.dtype)
    return embeds


def mm_stats(runner: object) -> dict:
    """The scheduler's ``mm_*`` statistics (empty for a text-only model)."""
    cache = getattr(getattr(runner, "model", None), "encoder_cache", None)
    if cache is None:
        return {}
    return {"mm_images_encoded": cache.misses, "mm_encoder_cache_hits": cache.hits,
            "mm_encoder_cache_bytes": cache.bytes, "mm_encode_ms": cache.timer.total_ms(),
            "mm_patches_encoded": cache.timer.patches}


def embed_prompt(model: Any, batch: Any) -> torch.Tensor:
    """Input embeddings of a vision-language model's extend batch: image tokens (pad ids,
    outside the vocabulary) get their encoder rows (``model.encode_images``, cached in
    ``model.encoder_cache``); every other token its embedding (``model.model.embed_tokens``)."""
    ids = batch.input_ids
    vocab = model.config.vocab_size
    embeds = model.model.embed_tokens(torch.where(ids >= vocab, torch.zeros_like(ids), ids))
    if batch.mm_inputs is not None:
        splice(embeds, batch.mm_inputs, model.encode_images, model.encoder_cache)
    return embeds

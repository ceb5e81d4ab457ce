"""Image embeddings into a prefill batch: the vision encoder runs once per batch on the images
whose rows the batch needs and that the ``EncoderCache`` does not hold, then each
``ImageSlice`` is copied over its token rows of the input embeddings."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence

import torch

from .inputs import ImageItem, MmBatch

Encode = Callable[[Sequence[ImageItem]], list[torch.Tensor]]
DEFAULT_CACHE_BYTES = 512 << 20  # EngineConfig.mm_embedding_cache_bytes replaces it at load


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
        for (key, item), emb in zip(missing.items(), encode(list(missing.values()))):
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
            "mm_encoder_cache_bytes": cache.bytes}


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

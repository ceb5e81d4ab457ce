"""Qwen2.5-VL: the vision transformer (``qwen2_5_vl_vision.py``) in front of a Qwen2 language
model with multimodal rotary positions (``multimodal/mrope.py``).

A prefill batch's image tokens carry hash-derived pad ids (``multimodal/inputs.py``); their
input embeddings are the encoder's rows (``ForwardBatch.mm_inputs``, spliced by
``multimodal/embed.py``). M-RoPE: prefill rows take their 3-row positions from the batch;
a decode row's position is its index plus its request's delta, kept per request-table row
(``row_delta``, written by every prefill of that row), so decode batches need nothing from
the scheduler and replay CUDA graphs unchanged.

Checkpoint names: transformers' current layout (``model.language_model.*``, ``model.visual.*``,
``lm_head``) and the original one (``model.*``, ``visual.*``) both load.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Sequence

import torch

from ..layers.attention.base import AttentionBackend
from ..layers.quantization.base import QuantConfig
from ..layers.weight_slices import copy_checked
from ..multimodal.embed import DEFAULT_CACHE_BYTES, EncoderCache, embed_prompt
from ..multimodal.inputs import ImageItem
from ..multimodal.mrope import MRotaryEmbedding
from .forward_batch import ForwardBatch, ForwardMode
from .llama import LlamaForCausalLM, LlamaModel
from .model_config import ModelConfig
from .qwen2_5_vl_vision import Qwen2_5_VisionTransformer

# Request-table rows whose M-RoPE delta is kept (the runner's table has
# max_running_requests + a few rows).
MAX_ROWS = 1 << 16


def mrope_sections(text_config: Any) -> list[int]:
    params = dict(getattr(text_config, "rope_parameters", None) or
                  getattr(text_config, "rope_scaling", None) or {})
    return list(params.get("mrope_section") or (16, 24, 24))


class Qwen2_5_VLTextModel(LlamaModel):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: str,
                 quant: QuantConfig | None = None) -> None:
        super().__init__(cfg, dtype, device, quant)
        self.mrope = MRotaryEmbedding(cfg.head_dim, cfg.rope_theta,
                                      mrope_sections(cfg.mm_config.text_config),
                                      dtype=dtype, device=device)
        self.register_buffer("row_delta", torch.zeros(MAX_ROWS, dtype=torch.int64,
                                                       device=device), persistent=False)

    def rope(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        rows, mm = batch.req_pool_indices, batch.mm_inputs
        if batch.mode is not ForwardMode.EXTEND:  # text tokens after the prompt: 1-D, shifted
            delta = self.row_delta.index_select(0, rows)
            if batch.mode is not ForwardMode.DECODE:  # spec verify: several tokens per request
                delta = delta.repeat_interleave(batch.extend_seq_lens, output_size=batch.num_tokens)
            # NOTE: a CUDA graph's padded rows decode position 0 on request row 0, a live (or
            # stale) row whose delta is negative after an image (max position + 1 < prompt
            # length): unclamped, the rotary lookup gathers a negative index (device-side
            # assert). A real row's position + delta is >= its prompt's max position + 1.
            return self.rotary_emb.lookup((batch.positions + delta).clamp_(min=0))
        if mm is None:  # text-only requests: delta 0 (the row may have served an image before)
            self.row_delta.index_fill_(0, rows, 0)
            return self.rotary_emb.lookup(batch.positions)
        self.row_delta.index_copy_(0, rows, mm.deltas)
        if mm.positions3 is None:
            return self.rotary_emb.lookup(batch.positions)
        return self.mrope.lookup(mm.positions3)

    def forward(self, batch: ForwardBatch, attn: AttentionBackend,
                embeds: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed_tokens(batch.input_ids) if embeds is None else embeds
        rope = self.rope(batch)
        residual = None
        for layer in self.layers:
            h, residual = layer(h, residual, rope, batch, attn)
        return self.norm(h) if residual is None else self.norm(h, residual)[0]


class Qwen2_5_VLForConditionalGeneration(LlamaForCausalLM):
    model_cls = Qwen2_5_VLTextModel

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", quant: QuantConfig | None = None) -> None:
        super().__init__(cfg, dtype, device, quant)
        with torch.device(device):
            self.visual = Qwen2_5_VisionTransformer(cfg.mm_config.vision_config).to(dtype)
        self.encoder_cache = EncoderCache(DEFAULT_CACHE_BYTES)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.attn_backend is None:
            raise RuntimeError("attention backend not set: the ModelRunner binds it")
        embeds = None
        if batch.mode is ForwardMode.EXTEND:
            embeds = embed_prompt(self, batch)
        return self.model(batch, self.attn_backend, embeds)

    def encode_images(self, items: Sequence[ImageItem]) -> list[torch.Tensor]:
        """Encoder rows ``[num_tokens, hidden]`` per image, all images in one pass."""
        device = self.visual.patch_embed.proj.weight.device
        pixels = torch.cat([i.encoder_input(device, self.visual.dtype) for i in items])
        out = self.visual(pixels, [i.grid_thw for i in items])
        return list(out.split([i.num_tokens for i in items]))

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = checkpoint_name(name)
            if "rotary_emb." in name or (self.lm_head is None and name.startswith("lm_head.")):
                continue
            if name.startswith("visual."):
                if name in params:
                    copy_checked(params[name].data, tensor, f"weight {name}")
                    loaded.add(name)
                continue
            loaded |= self.load_one(name, tensor, params)
        return loaded


def checkpoint_name(name: str) -> str:
    """transformers' current names -> the original layout ours follows."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name.startswith("model.visual."):
        return name[len("model."):]
    return name

"""LLaVA (transformers' ``LlavaForConditionalGeneration``): a CLIP vision tower
(``clip_vision.py``), a two-layer projector, and a Llama / Qwen2 language model whose image
token positions take the projected patch features (``multimodal/embed.py``).

Checkpoint names: transformers' current layout (``model.vision_tower.*``,
``model.multi_modal_projector.*``, ``model.language_model.*``, ``lm_head``) and the original one
(``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``language_model.model.*``,
``language_model.lm_head``) both load.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Sequence

import torch
from torch import nn

from ..layers.attention.base import AttentionBackend
from ..layers.quantization.base import QuantConfig
from ..layers.weight_slices import copy_checked
from ..multimodal.embed import DEFAULT_CACHE_BYTES, EncoderCache, embed_prompt
from ..multimodal.inputs import ImageItem
from .clip_vision import _ACTS, CLIPVisionTower
from .forward_batch import ForwardBatch, ForwardMode
from .llama import LlamaForCausalLM, LlamaModel
from .model_config import ModelConfig

_RENAMES = (("model.vision_tower.vision_model.", "vision_tower."), ("model.vision_tower.", "vision_tower."),
            ("vision_tower.vision_model.", "vision_tower."),
            ("model.multi_modal_projector.", "multi_modal_projector."),
            ("model.language_model.", "model."), ("language_model.model.", "model."),
            ("language_model.lm_head.", "lm_head."))
_VISION = ("vision_tower.", "multi_modal_projector.")


class LlavaProjector(nn.Module):
    def __init__(self, vision: int, text: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(vision, text, bias=bias)
        self.linear_2 = nn.Linear(text, text, bias=bias)
        self.act = _ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaTextModel(LlamaModel):
    def forward(self, batch: ForwardBatch, attn: AttentionBackend,
                embeds: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed_tokens(batch.input_ids) if embeds is None else embeds
        rope = self.rotary_emb.lookup(batch.positions)
        residual = None
        for layer in self.layers:
            h, residual = layer(h, residual, rope, batch, attn)
        return self.norm(h) if residual is None else self.norm(h, residual)[0]


class LlavaForConditionalGeneration(LlamaForCausalLM):
    model_cls = LlavaTextModel

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", quant: QuantConfig | None = None) -> None:
        super().__init__(cfg, dtype, device, quant)
        mm = cfg.mm_config
        if not isinstance(mm.vision_feature_layer, int):
            raise ValueError("LLaVA with several vision feature layers is not supported")
        self.keep_cls = mm.vision_feature_select_strategy == "full"
        with torch.device(device):
            self.vision_tower = CLIPVisionTower(mm.vision_config, mm.vision_feature_layer).to(dtype)
            self.multi_modal_projector = LlavaProjector(
                mm.vision_config.hidden_size, cfg.hidden_size, mm.projector_hidden_act,
                bool(getattr(mm, "multimodal_projector_bias", True))).to(dtype)
        self.encoder_cache = EncoderCache(DEFAULT_CACHE_BYTES)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.attn_backend is None:
            raise RuntimeError("attention backend not set: the ModelRunner binds it")
        embeds = embed_prompt(self, batch) if batch.mode is ForwardMode.EXTEND else None
        return self.model(batch, self.attn_backend, embeds)

    def encode_images(self, items: Sequence[ImageItem]) -> list[torch.Tensor]:
        weight = self.multi_modal_projector.linear_1.weight
        pixels = torch.cat([i.encoder_input(weight.device, weight.dtype) for i in items])
        feats = self.vision_tower(pixels)
        return list(self.multi_modal_projector(feats if self.keep_cls else feats[:, 1:]))

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = llava_name(name)
            if self.lm_head is None and name.startswith("lm_head."):
                continue
            if name.startswith(_VISION):
                if name in params:  # layers past the feature layer are not built
                    copy_checked(params[name].data, tensor, f"weight {name}")
                    loaded.add(name)
                continue
            loaded |= self.load_one(name, tensor, params)
        return loaded


def llava_name(name: str) -> str:
    for old, new in _RENAMES:
        if name.startswith(old):
            return new + name[len(old):]
    return name

"""pp: cutting a model down to one pipeline stage (``pipeline.py`` explains the split).

A model is built with every module outside this stage on the ``meta`` device (shapes, no
memory): dummy weights then draw the same random stream as at pp_size 1 (a meta parameter
draws its numbers into a scratch tensor and drops them), so PP=N and PP=1 dummy models are the
same model. ``drop_other_stages`` then replaces the meta modules by ``MissingLayer``s (no
parameters: loading, CPU layouts and quantization never see them), renumbers the kept layers'
KV indices to the stage's pool, and checkpoint tensors of other stages are skipped by name
(``owns_weight``) without being read.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from .pipeline import PipelineStage

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class MissingLayer(nn.Module):
    """Stands where another stage's module is (SGLang's ``PPMissingLayer``); never called."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a module of another pipeline stage was called")


def device_of(stage: PipelineStage, owned: bool, device: Any) -> Any:
    """Where a module is built: its device if this stage owns it, else ``meta``."""
    return device if owned or stage.size == 1 else "meta"


def drop_other_stages(model: nn.Module) -> None:
    """Replace the meta modules of a model built for a stage (see the module docstring)."""
    inner = getattr(model, "model", None)
    stage: PipelineStage | None = getattr(inner, "stage", None)
    if stage is None or stage.size == 1:
        return  # not a stage of a pipeline (or a model without the Llama layout)
    for i in range(stage.num_layers):
        if not stage.owns_layer(i):
            inner.layers[i] = MissingLayer()
        else:  # NOTE: the stage's KV pool holds its layers only, indexed from 0
            inner.layers[i].self_attn.layer_id = i - stage.start
    inner.stage_layers = tuple(inner.layers[i] for i in range(stage.start, stage.end))
    if not stage.needs_embedding(model.config.tie_word_embeddings):
        inner.embed_tokens = MissingLayer()
    if not stage.is_last:
        inner.norm = MissingLayer()
        if model.lm_head is not None:
            model.lm_head = MissingLayer()
    model.kv_cache_scales = {i - stage.start: s for i, s in model.kv_cache_scales.items()
                             if stage.owns_layer(i)}


def owns_weight(stage: PipelineStage, name: str, tied: bool) -> bool:
    """Whether checkpoint tensor ``name`` belongs to this stage's modules."""
    if stage.size == 1:
        return True
    layer = _LAYER.match(name)
    if layer is not None:
        return stage.owns_layer(int(layer.group(1)))
    if name.startswith("model.embed_tokens."):
        return stage.needs_embedding(tied)
    if name.startswith(("model.norm.", "lm_head.")):
        return stage.is_last
    return True


@torch.no_grad()
def draw_skipped(name: str, param: torch.Tensor, generator: torch.Generator,
                 device: torch.device, sharded: bool, std: float, fill_fp8: Any) -> None:
    """Advance ``generator`` as ``loader.fill_dummy_weights`` drawing the meta ``param`` at
    pp_size 1 would have (the same branch, shape, dtype and call), keeping nothing."""
    if name.endswith("norm.weight") or "_scale" in name.rsplit(".", 1)[-1]:
        return  # filled with a constant: no draw
    full = sharded and param.dtype != torch.float8_e4m3fn
    shape = getattr(param, "full_shape", param.shape) if full else param.shape
    scratch = torch.empty(shape, dtype=param.dtype, device=device)
    if param.dtype == torch.float8_e4m3fn:
        fill_fp8(scratch, generator)
    else:
        scratch.normal_(0.0, std, generator=generator)

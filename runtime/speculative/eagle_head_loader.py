"""Building an EAGLE / EAGLE3 head from its directory (published layout, or ``dummy`` random
weights at the directory's config) and choosing which target states it reads."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..config import EngineConfig
from ..errors import ModelLoadError
from ..layers.linear import LinearBase
from ..model.llama_eagle import EagleHead, read_head_config
from ..model.loader import fill_dummy_weights, iter_safetensors
from ..model.model_config import ModelConfig
from .hidden_capture import FINAL


def load_head(head_dir: Path, eagle3: bool, runner: Any, config: EngineConfig
              ) -> tuple[EagleHead, ModelConfig, dict[str, Any]]:
    """The head on the target's device and dtype, its Llama shape and raw config."""
    cfg, raw = read_head_config(head_dir)
    target_hidden = runner.model_config.hidden_size
    if not eagle3 and cfg.hidden_size != target_hidden:
        raise ModelLoadError(f"EAGLE head {head_dir}: hidden size {cfg.hidden_size} != the "
                             f"target's {target_hidden}")
    head = EagleHead(cfg, raw, eagle3, target_hidden, runner.dtype, runner.device)
    if config.load_format == "dummy":
        fill_dummy_weights(head, config.seed)
    else:
        missing = head.missing_weights(head.load_weights(_checkpoint(head_dir)))
        if missing:
            raise ModelLoadError(f"EAGLE head {head_dir} lacks weights: {', '.join(missing[:5])}")
    for module in head.modules():
        if isinstance(module, LinearBase):
            module.process_weights_after_loading()
    return head.eval(), cfg, raw


def _checkpoint(head_dir: Path) -> Iterator[tuple[str, Any]]:
    """safetensors files, else PyTorch ``*.bin`` (the first EAGLE heads were published so)."""
    files = sorted(Path(head_dir).glob("*.safetensors"))
    if files:
        yield from iter_safetensors(files, "cpu")
        return
    bins = sorted(Path(head_dir).glob("*.bin"))
    if not bins:
        raise ModelLoadError(f"EAGLE head directory {head_dir} has no *.safetensors or *.bin "
                             "weights (use load_format='dummy' for random weights)")
    for file in bins:
        yield from torch.load(file, map_location="cpu", weights_only=True).items()


def head_capture_points(raw: dict[str, Any], eagle3: bool, num_layers: int) -> tuple[int, ...]:
    """EAGLE: the target's final hidden state. EAGLE3: the residual stream entering layers
    ``eagle_aux_hidden_state_layer_ids + 1`` when the head's config names them, else SGLang's
    default ``(2, L // 2, L - 3)`` (each clamped into ``0 .. L``; L: the last layer's output)."""
    if not eagle3:
        return (FINAL,)
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    points = [i + 1 for i in ids] if ids else [2, num_layers // 2, num_layers - 3]
    return tuple(min(max(p, 0), num_layers) for p in points)

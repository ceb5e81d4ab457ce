"""DraftMemory: the GPU memory a drafter with a model of its own will take, so the target's KV
pool (sized first, from ``mem_fraction_static`` of the free memory) leaves room for it.

The target's runner sizes its KV as ``(free * mem_fraction_static - reserve) // (kv bytes per
token + per_slot)``: ``reserve`` holds the draft's weights (STANDALONE: a whole model; EAGLE: a
head), ``per_slot`` what the drafter keeps per target KV slot (STANDALONE: its own KV of the same
tokens; EAGLE: the hidden-state store and the head's one-layer KV). Estimates from the configs:
weights as a dense Llama of that shape, in the target's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..model.model_config import ModelConfig


@dataclass(frozen=True)
class DraftMemory:
    reserve: int = 0  # bytes taken once (weights)
    per_slot: int = 0  # bytes per target KV slot

    @classmethod
    def of(cls, config: Any, dtype: torch.dtype) -> "DraftMemory":
        """What ``config``'s drafter needs (nothing for NGRAM or no speculation)."""
        algo = config.speculative_algorithm
        if algo not in ("STANDALONE", "EAGLE", "EAGLE3"):
            return cls()
        from .standalone import resolve_draft_dir

        size = torch.empty((), dtype=dtype).element_size()
        draft_dir = resolve_draft_dir(config)
        if algo == "STANDALONE":
            cfg = ModelConfig.from_dir(draft_dir)
            return cls(weight_bytes(cfg, size), kv_bytes_per_token(cfg, size))
        from ..model.llama_eagle import read_head_config

        cfg, raw = read_head_config(draft_dir)
        vocab = int(raw.get("draft_vocab_size") or 0) if algo == "EAGLE3" else 0
        reserve = weight_bytes(cfg, size, layers=1, vocab=vocab) + 3 * cfg.hidden_size ** 2 * size
        return cls(reserve, kv_bytes_per_token(cfg, size, layers=1) + cfg.hidden_size * size)


def weight_bytes(cfg: ModelConfig, size: int, layers: int | None = None,
                 vocab: int | None = None) -> int:
    """A dense Llama's weights: ``layers`` decoder layers and ``vocab`` rows of embedding and
    head (None: the config's own; tied embeddings count once)."""
    h = cfg.hidden_size
    layer = h * (2 * cfg.q_size + 2 * cfg.kv_size) + 3 * h * cfg.intermediate_size
    n_layers = cfg.num_layers if layers is None else layers
    if vocab is None:
        vocab_rows = cfg.vocab_size * (1 if cfg.tie_word_embeddings else 2)
    else:
        vocab_rows = vocab
    return (n_layers * layer + vocab_rows * h) * size


def kv_bytes_per_token(cfg: ModelConfig, size: int, layers: int | None = None) -> int:
    n_layers = cfg.num_layers if layers is None else layers
    return 2 * n_layers * cfg.num_kv_heads * cfg.head_dim * size

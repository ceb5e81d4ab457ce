"""EAGLE and EAGLE3 draft heads (one Llama decoder layer over the target's hidden states), in
their published checkpoint layouts (SafeAILab/EAGLE ``cnets.py``; SGLang's llama_eagle*.py).

EAGLE (e.g. yuhuili/EAGLE-LLaMA3.1-Instruct-8B): ``fc`` (with bias) maps [embedding; hidden]
to the hidden size; ``layers.0`` is a Llama decoder layer without its input norm; the output
is ``mlp + residual`` (no final norm), read by the target's ``lm_head`` and fed back as the next
step's hidden state.

EAGLE3 (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): ``fc`` (no bias) maps three target layers'
states concatenated (3 x target hidden) to the hidden size; ``midlayer`` attends over
[input_layernorm(embedding); hidden_norm(hidden)] (its q/k/v read 2 x hidden); a final ``norm``
feeds its own ``lm_head`` over a draft vocabulary (``d2t[i]``: target id = i + d2t[i]); the
state before that norm is the next step's hidden. The token embedding is the target's.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError
from ..layers.linear import QKVParallelLinear
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from ..layers.weight_slices import materialize
from .forward_batch import ForwardBatch
from .llama import LlamaAttention, LlamaMLP
from .llama_weights import _packed_target, load_param, unloaded_params
from .model_config import ModelConfig

EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def read_head_config(head_dir: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """The head's Llama shape (as a ModelConfig) and its raw config.json."""
    path = Path(head_dir) / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"EAGLE head directory {head_dir} has no config.json")
    raw = json.loads(path.read_text())
    from transformers import LlamaConfig

    fields = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    return ModelConfig.from_hf(LlamaConfig(**fields), "LlamaForCausalLM"), raw


class EagleHead(nn.Module):
    """One draft step: ``forward(batch, attn, embeds, hidden) -> (to_logits, next_hidden)``."""

    def __init__(self, cfg: ModelConfig, raw: dict[str, Any], eagle3: bool, target_hidden: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eagle3 = eagle3
        h = cfg.hidden_size
        kw = dict(dtype=dtype, device=device)
        if eagle3:
            width = 3 * int(raw.get("target_hidden_size") or target_hidden)
            self.fc = nn.Linear(width, h, bias=bool(raw.get("bias", False)), **kw)
        else:
            self.fc = nn.Linear(2 * h, h, bias=bool(raw.get("bias", True)), **kw)
        self.self_attn = LlamaAttention(cfg, 0, dtype, str(device))
        if eagle3:  # q/k/v read [embedding; hidden]
            self.self_attn.qkv_proj = QKVParallelLinear(2 * h, cfg.head_dim, cfg.num_heads,
                                                        cfg.num_kv_heads, bias=False, **kw)
            self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps, **kw)
            self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps, **kw)
            self.norm = RMSNorm(h, cfg.rms_norm_eps, **kw)
        self.mlp = LlamaMLP(cfg, dtype, str(device))
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps, **kw)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.max_context_len, cfg.rope_theta,
                                          cfg.rope_scaling, **kw)
        draft_vocab = raw.get("draft_vocab_size") if eagle3 else None
        # EAGLE reads the target's lm_head; EAGLE3 its own (unless it has no draft vocab)
        self.lm_head = (nn.Linear(h, int(draft_vocab), bias=False, **kw)
                        if draft_vocab else None)
        vocab = int(draft_vocab or cfg.vocab_size)
        self.register_buffer("d2t", torch.zeros(vocab, dtype=torch.int64, device=device))

    def forward(self, batch: ForwardBatch, attn: Any, embeds: torch.Tensor,
                hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rope = self.rotary_emb.lookup(batch.positions)
        if not self.eagle3:
            h = self.fc(torch.cat([embeds, hidden.to(embeds.dtype)], dim=-1))
            x = self.self_attn(h, rope, batch, attn)  # NOTE: layer 0 has no input norm
            x, residual = self.post_attention_layernorm(x, h)
            out = self.mlp(x) + residual
            return out, out
        hidden = hidden.to(embeds.dtype)
        if hidden.shape[-1] != embeds.shape[-1]:  # the target's layers (else: fc applied already)
            hidden = self.fc(hidden)
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        x = self.self_attn(x, rope, batch, attn)
        x, residual = self.post_attention_layernorm(x, hidden)
        to_logits, to_next = self.norm(self.mlp(x), residual)
        return to_logits, to_next

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """fp32 logits over the draft vocabulary; None: use the target's lm_head."""
        if self.lm_head is None:
            return None
        return F.linear(hidden, self.lm_head.weight).float()

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        """Checkpoint tensors by their published names (``layers.0.`` / ``midlayer.``, an
        optional ``model.`` prefix); the embedding and ``t2d`` are not ours. Returns the
        parameter names filled (packed ones per shard)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            for prefix in ("layers.0.", "midlayer."):
                if name.startswith(prefix):
                    name = name[len(prefix):]
            if name == "d2t":
                self.d2t.copy_(materialize(tensor).to(torch.int64))
                loaded.add(name)
                continue
            target = _packed_target("." + name)
            if target is not None:
                ours, shard = target[0][1:], target[1]
                params[ours].weight_loader(params[ours], tensor, shard)
                loaded.add(f"{ours}:{shard}")
            elif name in params:
                load_param(params[name], tensor, name)
                loaded.add(name)
        return loaded

    def missing_weights(self, loaded: set[str]) -> list[str]:
        missing = unloaded_params(self, loaded)
        if self.lm_head is not None and "d2t" not in loaded:
            missing.append("d2t")
        return missing

"""Attention backend interface. A backend reads and writes the runtime's paged KV pool
(one slot per token, ``req_to_token[req_pool_idx, pos] -> slot``); models call it once per layer.

Implementations: ``torch_native`` (CPU and GPU reference) and ``triton`` (GPU kernels).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ...model.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """One instance per model runner; stateless across batches except for metadata caches."""

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Precompute per-batch indices (once per forward, not per layer) into batch.attn_metadata."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] (new tokens only)
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        layer_id: int,
        batch: ForwardBatch,
        scaling: float,
    ) -> torch.Tensor:
        """Store k/v of the new tokens at batch.out_cache_loc, then attend causally over the
        request's whole sequence (cached prefix + new tokens). Returns [num_tokens, num_heads, head_dim]."""

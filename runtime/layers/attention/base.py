"""Attention backend interface. A backend reads and writes the runtime's paged KV pool
(one slot per token, ``req_to_token[req_pool_idx, pos] -> slot``); models call it once per layer.

Implementations: ``torch_native`` (CPU and GPU reference) and ``triton`` (GPU kernels).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ...model.forward_batch import ForwardBatch


@dataclass(frozen=True)
class KVStoreTarget:
    """Where one layer's new k/v go: its pool buffers ``[slots, kv_heads, head_dim]``, the
    slot of each new token and the fp8 scales (1.0 for a cache in the model dtype)."""

    k_buf: torch.Tensor
    v_buf: torch.Tensor
    loc: torch.Tensor
    k_scale: float
    v_scale: float


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
        kv_stored: bool = False,
    ) -> torch.Tensor:
        """Store k/v of the new tokens at batch.out_cache_loc (unless ``kv_stored``: the model
        wrote them to ``kv_store_target``), then attend causally over the request's whole
        sequence (cached prefix + new tokens). Returns [num_tokens, num_heads, head_dim]."""

    def kv_store_target(self, layer_id: int, batch: ForwardBatch) -> KVStoreTarget | None:
        """Where a model may write the new k/v itself, fused into the kernel that makes k
        (one launch fewer per layer), then call ``forward(..., kv_stored=True)``; None: this
        backend stores them in ``forward``."""
        return None

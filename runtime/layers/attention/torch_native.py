"""Torch-native attention over the paged KV pool: the CPU path and the GPU reference.

Per forward, ``init_forward_metadata`` gathers each request's slot list from ``req_to_token``
once; every layer then writes its new k/v at ``out_cache_loc`` and reads the request's keys and
values by those slots. Decode batches run as one padded ``scaled_dot_product_attention`` call
with GQA folded into the query-length axis (the ``g`` query heads of a kv group attend the same
keys with no causal relation among them); extend runs one call per request with a causal mask
aligned to the end of the sequence (new tokens sit after the cached prefix).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...model.forward_batch import ForwardBatch
from .base import AttentionBackend


@dataclass
class DecodeMetadata:
    slots: torch.Tensor  # [bs, max_len] KV slots, padded with slot 0
    mask: torch.Tensor | None  # [bs, 1, 1, max_len] bool, None when no padding

    @property
    def flat_slots(self) -> torch.Tensor:
        return self.slots.view(-1)


@dataclass
class ExtendSegment:
    start: int  # first row of this request in the flattened tokens
    length: int  # new tokens
    prefix_len: int
    slots: torch.Tensor | None  # [prefix + length] KV slots; None: no prefix, use fresh k/v
    mask: torch.Tensor | None  # [length, prefix + length] bool, None: plain causal


@dataclass
class ExtendMetadata:
    segments: list[ExtendSegment]


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, runner: Any) -> None:
        self.req_to_token = runner.req_to_token_pool.req_to_token
        self.kv_pool = runner.token_kv_pool
        self.device = self.req_to_token.device
        # NOTE: on CUDA, SDPA may pick cuDNN, which builds a new graph for every new sequence
        # length (~4 ms of CPU per call in decode, measured on H200); flash / mem-efficient
        # kernels take any length.
        self._sdpa_scope = ((lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION,
                                                 SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]))
                            if self.device.type == "cuda" else contextlib.nullcontext)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode.is_decode:
            batch.attn_metadata = self._decode_metadata(batch)
        else:
            batch.attn_metadata = self._extend_metadata(batch)

    def _decode_metadata(self, batch: ForwardBatch) -> DecodeMetadata:
        seq_lens = batch.seq_lens_cpu or batch.seq_lens.tolist()
        max_len = max(seq_lens)
        rows = self.req_to_token[:, :max_len].index_select(0, batch.req_pool_indices)
        if min(seq_lens) == max_len:
            return DecodeMetadata(rows, None)
        valid = torch.arange(max_len, device=self.device)[None, :] < batch.seq_lens[:, None]
        # NOTE: padded positions point at slot 0 (the pool's dummy row) and are masked out.
        return DecodeMetadata(rows.masked_fill(~valid, 0), valid[:, None, None, :])

    def _extend_metadata(self, batch: ForwardBatch) -> ExtendMetadata:
        prefix = batch.extend_prefix_lens_cpu or batch.extend_prefix_lens.tolist()
        lengths = batch.extend_seq_lens_cpu or batch.extend_seq_lens.tolist()
        rows = batch.req_pool_indices.tolist()
        segments, start = [], 0
        tree = batch.spec_info  # spec: TARGET_VERIFY's draft-tree masks (speculative.verify_batch)
        for i, (row, p, n) in enumerate(zip(rows, prefix, lengths)):
            if tree is not None:  # spec: the prefix, then the node's tree ancestors
                prefix_cols = torch.ones(n, p, dtype=torch.bool, device=self.device)
                segments.append(ExtendSegment(start, n, p, self.req_to_token[row, : p + n],
                                              torch.cat([prefix_cols, tree.masks[i]], dim=1)))
            elif p == 0:
                segments.append(ExtendSegment(start, n, 0, None, None))
            else:
                slots = self.req_to_token[row, : p + n]
                q_pos = torch.arange(p, p + n, device=self.device)
                mask = torch.arange(p + n, device=self.device)[None, :] <= q_pos[:, None]
                segments.append(ExtendSegment(start, n, p, slots, mask))
            start += n
        return ExtendMetadata(segments)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: ForwardBatch, scaling: float, kv_stored: bool = False) -> torch.Tensor:
        if not kv_stored:  # (always: this backend offers no kv_store_target)
            self._store(k, v, layer_id, batch)
        self.kv_pool.wait_layer(layer_id)  # hicache: this layer's host->device load has landed
        meta = batch.attn_metadata
        with self._sdpa_scope():
            if isinstance(meta, DecodeMetadata):
                return self._decode(q, layer_id, meta, scaling)
            return self._extend(q, k, v, layer_id, meta, scaling)

    def _store(self, k: torch.Tensor, v: torch.Tensor, layer_id: int,
               batch: ForwardBatch) -> None:
        # NOTE: index_copy_ / index_select rather than advanced indexing: on CPU the latter
        # goes through a generic parallel kernel that costs ~10x more for these tiny copies.
        pool = self.kv_pool
        if pool.quantized:
            pool.write(layer_id, batch.out_cache_loc, k, v)
            return
        if k.dtype != pool.dtype:
            k, v = k.to(pool.dtype), v.to(pool.dtype)
        pool.k_buffer[layer_id].index_copy_(0, batch.out_cache_loc, k)
        pool.v_buffer[layer_id].index_copy_(0, batch.out_cache_loc, v)

    def _decode(self, q: torch.Tensor, layer_id: int, meta: DecodeMetadata,
                scaling: float) -> torch.Tensor:
        bs, num_heads, head_dim = q.shape
        pool = self.kv_pool
        kv_heads = pool.k_buffer[layer_id].shape[1]
        shape = (bs, meta.slots.shape[1], kv_heads, head_dim)
        if pool.quantized:
            k_cache, v_cache = (t.view(shape) for t in pool.read(layer_id, meta.flat_slots, q.dtype))
        else:
            k_cache = pool.k_buffer[layer_id].index_select(0, meta.flat_slots).view(shape)
            v_cache = pool.v_buffer[layer_id].index_select(0, meta.flat_slots).view(shape)
        qg = q.view(bs, kv_heads, num_heads // kv_heads, head_dim)
        if k_cache.dtype != q.dtype:
            k_cache, v_cache = k_cache.to(q.dtype), v_cache.to(q.dtype)
        out = F.scaled_dot_product_attention(qg, k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                             attn_mask=meta.mask, scale=scaling)
        return out.reshape(bs, num_heads, head_dim)

    def _extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                meta: ExtendMetadata, scaling: float) -> torch.Tensor:
        outs = []
        for seg in meta.segments:
            qs = q[seg.start: seg.start + seg.length].transpose(0, 1)  # [h, n, d]
            if seg.slots is None:
                ks = k[seg.start: seg.start + seg.length]
                vs = v[seg.start: seg.start + seg.length]
            else:
                ks, vs = self.kv_pool.read(layer_id, seg.slots, q.dtype)
            out = F.scaled_dot_product_attention(
                qs, ks.transpose(0, 1), vs.transpose(0, 1), attn_mask=seg.mask,
                is_causal=seg.mask is None, scale=scaling, enable_gqa=True)
            outs.append(out.transpose(0, 1))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

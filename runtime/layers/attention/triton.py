"""Triton attention over the paged KV pool: the GPU path.

Every layer stores its new k/v with one fused kernel (or the model stores them, see
``kv_store_target``), then runs the extend kernel (cached prefix from the pool + causal new
tokens) or the split-K decode kernel. Decode needs no per-step tensor ops (each request's split
count is computed in the kernel) and no host sync, so a decode forward can be captured in a
CUDA graph; the split-K scratch buffers are preallocated for the largest batch so captured
graphs keep pointing at the same memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...kernels.decode_attention import decode_attention_fwd, decode_merge, decode_stage1
from ...kernels.extend_attention import extend_attention_fwd
from ...kernels.prefix_decode_attention import prefix_block_members, prefix_decode_attention
from ...kernels.kv_store import store_kv
from ...model.forward_batch import ForwardBatch
from ..upload import to_device
from .base import AttentionBackend, KVStoreTarget

# NOTE: powers of two (stage 2 reduces over all of them). Small batches split each sequence
# into chunks of >= 32 tokens so that a batch-1 decode still spreads over the SMs; large
# batches already fill the GPU with (request, kv head) programs and get fewer splits
# (splits_cap). 32, not 64: one layer's batch-1 decode attention (stage 1 + merge, Llama-3.1-8B
# shapes, CUDA graph) took 5.63 / 5.57 us at 160 / 384 tokens against 6.91 / 7.26 us with 64
# (H100, 2026-11-24, ``bench_kernels.py --batch1``): one 32-key iteration per program.
MAX_KV_SPLITS = 16
MIN_TOKENS_PER_SPLIT = 32


def splits_cap(bs: int, kv_heads: int, num_sms: int) -> int:
    """Largest useful split count for a batch: about 16 programs per SM in total (each
    program is latency-bound on its gathered K/V loads, so many must be in flight; measured
    on an H200: bs=128 x 1280 tokens took 229 us with ~5 splits, 298 us with 1)."""
    want = -(-16 * num_sms // max(bs * kv_heads, 1))
    cap = 1
    while cap < want and cap < MAX_KV_SPLITS:
        cap *= 2
    return cap


@dataclass
class TritonDecodeMetadata:
    # NOTE: each request's split count (its length over MIN_TOKENS_PER_SPLIT, at most
    # max_kv_splits) is computed in the kernel: no tensor ops per step before it.
    max_kv_splits: int  # launch width, a power of two <= MAX_KV_SPLITS
    mid_o: torch.Tensor  # [bs, H, S, D] fp32 scratch
    mid_lse: torch.Tensor  # [bs, H, S] fp32 scratch
    # Cascade: suffix partials in splits [0, max_kv_splits), shared-prefix partials in
    # [max_kv_splits, 2 * max_kv_splits) (see kernels/prefix_decode_attention.py).
    shared: Any = None  # SharedPrefix or None


@dataclass
class TritonExtendMetadata:
    max_extend_len: int


@dataclass
class TritonMixedMetadata:
    """An extend with one-token rows: those (``rows``, their tokens ``tok``) through the decode
    kernel, the others (``ext``) through the extend kernel."""

    decode: TritonDecodeMetadata
    tok: torch.Tensor
    req_pool_indices: torch.Tensor  # of ``rows``
    seq_lens: torch.Tensor  # of ``rows``
    ext: list[torch.Tensor]  # extend kernel's pool rows, prefix lens, lens, start locs
    max_extend_len: int


class TritonAttnBackend(AttentionBackend):
    def __init__(self, runner: Any) -> None:
        self.req_to_token = runner.req_to_token_pool.req_to_token
        self.kv_pool = runner.token_kv_pool
        self.device = self.req_to_token.device
        cfg = runner.model_config
        # this rank's q heads (all of them at tp_size 1)
        self.num_heads = getattr(runner, "num_local_heads", cfg.num_heads)
        self.head_dim = cfg.head_dim
        self.kv_heads = self.kv_pool.k_buffer[0].shape[1]
        self.num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                        if self.device.type == "cuda" else 8)
        self._graph_bs = 0  # scratch rows that captured CUDA graphs point at
        # Requests per shared-prefix tile; the scheduler groups decode requests for it.
        self.prefix_members = prefix_block_members(self.num_heads, self.kv_heads)
        self._mid_o, self._mid_lse = self._alloc_scratch(8)

    def _alloc_scratch(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        mid_o = torch.empty(bs, self.num_heads, MAX_KV_SPLITS, self.head_dim,
                            dtype=torch.float32, device=self.device)
        mid_lse = torch.empty(bs, self.num_heads, MAX_KV_SPLITS, dtype=torch.float32,
                              device=self.device)
        return mid_o, mid_lse

    def _scratch(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Split-K scratch for bs requests: slices of the shared buffers, grown on demand.

        NOTE: once graphs are captured the shared buffers are never replaced (the graphs hold
        their addresses); a larger eager batch then gets a private allocation instead."""
        if self._mid_lse.shape[0] < bs:
            if self._graph_bs:
                return self._alloc_scratch(bs)
            self._mid_o, self._mid_lse = self._alloc_scratch(bs)
        return self._mid_o[:bs], self._mid_lse[:bs]

    def init_cuda_graph_state(self, max_bs: int) -> None:
        """Allocate scratch for the largest captured batch; call before any capture."""
        if self._mid_lse.shape[0] < max_bs:
            self._mid_o, self._mid_lse = self._alloc_scratch(max_bs)
        self._graph_bs = max(self._graph_bs, max_bs)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode.is_decode:
            batch.attn_metadata = self._decode_meta(batch.batch_size, batch.shared_prefix)
            return
        lengths = batch.extend_seq_lens_cpu or batch.extend_seq_lens.tolist()
        single = [i for i, n in enumerate(lengths) if n == 1]
        if not single or batch.spec_info is not None:  # spec: every tree row tree-masked
            batch.attn_metadata = TritonExtendMetadata(max(lengths) if lengths else 0)
        else:
            batch.attn_metadata = self._mixed_meta(batch, lengths, single)

    def _decode_meta(self, bs: int, shared: Any = None) -> TritonDecodeMetadata:
        mid_o, mid_lse = self._scratch(bs)
        cap = splits_cap(bs, self.kv_heads, self.num_sms)
        if shared is not None:
            # NOTE: the suffix and prefix partials share the scratch's split slots; the
            # prefix slots of requests in no tile must weigh 0 in the merge (-inf). The
            # suffix splits count the tokens after the prefix (stage 1's ``starts``).
            cap = min(cap, MAX_KV_SPLITS // 2)
            mid_lse[:, :, cap:2 * cap].fill_(float("-inf"))
        return TritonDecodeMetadata(cap, mid_o, mid_lse, shared)

    def _mixed_meta(self, batch: ForwardBatch, lengths: list[int],
                    single: list[int]) -> "TritonMixedMetadata":
        """An extend whose one-token rows run the split-K decode kernel: requests whose
        prompt is cached but for its last token (forks of one prompt, requests resumed after a
        retraction). The extend kernel gives each (row, query head) one program over the
        whole prefix, with no split and the kv group re-read per head."""
        starts, at = [], 0
        for n in lengths:
            starts.append(at)
            at += n
        multi = [i for i, n in enumerate(lengths) if n > 1]
        dev = lambda v: to_device(torch.tensor(v, dtype=torch.int64), self.device)  # noqa: E731
        rows, ext = dev(single), dev(multi)
        seq_lens = batch.seq_lens.index_select(0, rows)
        return TritonMixedMetadata(
            self._decode_meta(len(single)), dev([starts[i] for i in single]),
            batch.req_pool_indices.index_select(0, rows), seq_lens,
            [t.index_select(0, ext) for t in (batch.req_pool_indices, batch.extend_prefix_lens,
                                              batch.extend_seq_lens, batch.extend_start_loc)],
            max((lengths[i] for i in multi), default=0))

    def kv_store_target(self, layer_id: int, batch: ForwardBatch) -> KVStoreTarget:
        pool = self.kv_pool
        return KVStoreTarget(pool.k_buffer[layer_id], pool.v_buffer[layer_id],
                             batch.out_cache_loc, pool.k_scale[layer_id], pool.v_scale[layer_id])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: ForwardBatch, scaling: float, kv_stored: bool = False) -> torch.Tensor:
        pool = self.kv_pool
        pool.wait_layer(layer_id)  # hicache: this layer's host->device load has landed
        k_buf, v_buf = pool.k_buffer[layer_id], pool.v_buffer[layer_id]
        # fp8 cache: per-layer scales (1.0 for a cache in the model dtype)
        scales = dict(k_scale=pool.k_scale[layer_id], v_scale=pool.v_scale[layer_id])
        if not kv_stored:
            store_kv(k, v, k_buf, v_buf, batch.out_cache_loc, **scales)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        meta = batch.attn_metadata
        if isinstance(meta, TritonDecodeMetadata) and meta.shared is not None:
            return self._cascade_decode(q, k_buf, v_buf, out, batch, meta, scaling, scales)
        if isinstance(meta, TritonMixedMetadata):
            return self._mixed(q, k, v, out, k_buf, v_buf, batch, meta, scaling, scales)
        if isinstance(meta, TritonDecodeMetadata):
            return decode_attention_fwd(
                q, k_buf, v_buf, out, self.req_to_token, batch.req_pool_indices,
                batch.seq_lens, None, meta.mid_o, meta.mid_lse, scaling, meta.max_kv_splits,
                min_tokens_per_split=MIN_TOKENS_PER_SPLIT, **scales)
        tree = batch.spec_info  # spec: TARGET_VERIFY's draft-tree masks
        return extend_attention_fwd(
            q, k, v, out, k_buf, v_buf, self.req_to_token, batch.req_pool_indices,
            batch.extend_prefix_lens, batch.extend_seq_lens, batch.extend_start_loc,
            meta.max_extend_len, scaling, **scales,
            custom_mask=tree.flat if tree is not None else None,
            mask_starts=tree.starts if tree is not None else None)

    def _cascade_decode(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                        out: torch.Tensor, batch: ForwardBatch, meta: TritonDecodeMetadata,
                        scaling: float, scales: dict[str, float]) -> torch.Tensor:
        """Each request's own suffix split-K, each group's shared prefix once per tile, one
        merge of both sets of partials."""
        s, cap = meta.shared, meta.max_kv_splits
        decode_stage1(q, k_buf, v_buf, self.req_to_token, batch.req_pool_indices,
                      batch.seq_lens, None, meta.mid_o, meta.mid_lse, scaling, cap,
                      starts=s.prefix_lens, min_tokens_per_split=MIN_TOKENS_PER_SPLIT, **scales)
        prefix_decode_attention(q, k_buf, v_buf, self.req_to_token, s.tile_rows, s.tile_lens,
                                s.tile_members, meta.mid_o, meta.mid_lse, scaling, cap, cap,
                                **scales)
        return decode_merge(meta.mid_o, meta.mid_lse, out, 2 * cap)

    def _mixed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
               k_buf: torch.Tensor, v_buf: torch.Tensor, batch: ForwardBatch,
               meta: TritonMixedMetadata, scaling: float,
               scales: dict[str, float]) -> torch.Tensor:
        """Decode kernel over the one-token rows (their k/v are stored already), extend
        kernel over the rest, each writing its own rows of ``out``."""
        d = meta.decode
        q_dec = q.index_select(0, meta.tok)
        out_dec = decode_attention_fwd(
            q_dec, k_buf, v_buf, torch.empty_like(q_dec), self.req_to_token,
            meta.req_pool_indices, meta.seq_lens, None, d.mid_o, d.mid_lse, scaling,
            d.max_kv_splits, min_tokens_per_split=MIN_TOKENS_PER_SPLIT, **scales)
        out.index_copy_(0, meta.tok, out_dec)
        if meta.max_extend_len:
            extend_attention_fwd(q, k, v, out, k_buf, v_buf, self.req_to_token, *meta.ext,
                                 meta.max_extend_len, scaling, **scales)
        return out

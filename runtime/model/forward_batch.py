"""ForwardBatch: everything one model forward needs, as tensors on the model's device.

The scheduler builds it; the model and the attention backend only read it. Tokens of all
requests are flattened into one ragged sequence (no padding): request i owns the slice
``extend_start_loc[i] : extend_start_loc[i] + extend_seq_lens[i]`` of ``input_ids``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill of new tokens on top of a (possibly cached) prefix
    DECODE = "decode"  # exactly one new token per request
    # spec: an extend over each request's draft tree (runtime/speculative): the new tokens
    # attend to the prefix and to their tree ancestors only (``ForwardBatch.spec_info``).
    TARGET_VERIFY = "target_verify"

    @property
    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass
class ForwardBatch:
    mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64, absolute position of each token
    req_pool_indices: torch.Tensor  # [bs] int64, row of req_to_token for each request
    seq_lens: torch.Tensor  # [bs] int64, total tokens per request after this forward
    out_cache_loc: torch.Tensor  # [num_tokens] int64, KV slots the new tokens are written to
    extend_prefix_lens: torch.Tensor  # [bs] int64, cached tokens before the new ones (decode: seq_len-1)
    extend_seq_lens: torch.Tensor  # [bs] int64, new tokens per request (decode: all ones)
    extend_start_loc: torch.Tensor  # [bs] int64, offset of each request in input_ids
    # Which token rows need logits: by default the last new token of each request. Requests
    # asking for prompt logprobs need more rows; see logits_indices.
    logits_indices: torch.Tensor | None = None
    # CPU copies for code that must not sync the device (python ints).
    seq_lens_cpu: list[int] = field(default_factory=list)
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_seq_lens_cpu: list[int] = field(default_factory=list)
    # Decode only, optional: groups of requests sharing a cached prefix
    # (layers/attention/shared_prefix.SharedPrefix); a backend may read such a prefix once per
    # group (cascade attention) or ignore it. Never changes results.
    shared_prefix: Any = None
    # spec: TARGET_VERIFY only: the draft trees' attention masks (speculative.tree_mask.TreeMask)
    spec_info: Any = None
    # mm: extend only, optional: the batch's image rows and M-RoPE positions
    # (runtime/multimodal/inputs.MmBatch); None: no request of the batch has images.
    mm_inputs: Any = None
    # Filled by the attention backend's init_forward_metadata.
    attn_metadata: Any = None
    # pp: the previous pipeline stage's output [num_tokens, 2, hidden] (hidden states and the
    # residual, distributed/pipeline.py); None on the first stage and without PP.
    pp_proxy: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def last_token_indices(self) -> torch.Tensor:
        return self.extend_start_loc + self.extend_seq_lens - 1

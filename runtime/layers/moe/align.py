"""Sort (token, expert) pairs by expert and pad each expert's run to a multiple of the GEMM's
row block, so every row block of the grouped GEMM belongs to one expert.

Pure tensor ops with shapes that depend only on the number of tokens (no host sync), so the
MoE forward can be captured in a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertAlignment:
    sorted_ids: torch.Tensor  # [max_len] int32: flat (token * top_k + slot) ids; pad = T * top_k
    block_expert: torch.Tensor  # [max_len // block_m] int32: expert of each row block
    num_padded: torch.Tensor  # [1] int32: rows in use (blocks past it are skipped)
    block_m: int


def max_padded_len(num_pairs: int, num_experts: int, block_m: int) -> int:
    """At most min(E, pairs) experts are non-empty, each padded by < block_m rows."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-rows // block_m) * block_m


# Up to this many (token, expert) pairs (decode batches), each pair gets a row block of its
# own instead of sorting: no alignment kernels at all (the layout depends only on the pair
# count), at the price of reading an expert twice when two pairs pick it (at batch 1 never: a
# token's k experts are distinct).
PAIR_BLOCKS_MAX = 32
_PAIR_LAYOUTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def align_pairs(topk_ids: torch.Tensor, block_m: int) -> ExpertAlignment:
    """One row block per pair: block b holds pair b (other rows padding), expert topk_ids[b]."""
    n = topk_ids.numel()
    key = (n, block_m, topk_ids.device)
    if key not in _PAIR_LAYOUTS:  # built once per size (outside graph capture: the warm-up)
        rows = torch.full((n, block_m), n, dtype=torch.int32, device=topk_ids.device)
        rows[:, 0] = torch.arange(n, dtype=torch.int32, device=topk_ids.device)
        _PAIR_LAYOUTS[key] = (rows.view(-1), torch.tensor([n * block_m], dtype=torch.int32,
                                                          device=topk_ids.device))
    sorted_ids, used = _PAIR_LAYOUTS[key]
    return ExpertAlignment(sorted_ids, topk_ids.reshape(-1).to(torch.int32), used, block_m)


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertAlignment:
    """``topk_ids [T, k]`` -> the expert-sorted, block-padded order of its ``T * k`` pairs."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    dev = flat.device
    # NOTE: scatter_add rather than bincount: bincount sizes its output from the data (sync).
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    end_padded = torch.cumsum(padded, 0)
    start_padded = end_padded - padded
    start = torch.cumsum(counts, 0) - counts
    sorted_expert, order = torch.sort(flat, stable=True)
    rank = torch.arange(n, device=dev) - start[sorted_expert]
    max_len = max_padded_len(n, num_experts, block_m)
    sorted_ids = torch.full((max_len,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, start_padded[sorted_expert] + rank, order.to(torch.int32))
    block_starts = torch.arange(0, max_len, block_m, device=dev)
    block_expert = torch.searchsorted(end_padded, block_starts, right=True)
    block_expert = block_expert.clamp_(max=num_experts - 1).to(torch.int32)
    return ExpertAlignment(sorted_ids, block_expert, end_padded[-1:].to(torch.int32), block_m)

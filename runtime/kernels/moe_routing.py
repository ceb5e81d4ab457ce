"""Top-k softmax routing in one kernel: per token, softmax over the experts (fp32), the k
largest (ties: lowest expert index), optionally renormalized. Replaces ~5 torch launches per
MoE layer (softmax, topk, sum, div, cast), which at batch 1 cost more than the math.

Expert parallelism's all_reduce path asks for ids local to one rank (``local=(first, count)``):
expert ``first + j`` is stored as ``j``, another rank's expert as ``count`` (which the fused MoE
kernel skips), so that path adds no launch over plain TP's."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _topk_softmax_kernel(Logits, W, Ids, num_experts, stride_l, first_local, num_local,
                         TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                         RENORM: tl.constexpr, LOCAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    mask = offs < num_experts
    x = tl.load(Logits + row * stride_l + offs, mask=mask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(mask, p, 0.0)
    p = p / tl.sum(p, 0)
    slots = tl.arange(0, BLOCK_K)
    vals = tl.zeros([BLOCK_K], dtype=tl.float32)
    idxs = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, 0)
        idx = tl.min(tl.where(p == best, offs, BLOCK_E), 0)
        vals = tl.where(slots == j, best, vals)
        idxs = tl.where(slots == j, idx, idxs)
        p = tl.where(offs == idx, -1.0, p)  # probabilities are >= 0: never picked again
    if RENORM:
        vals = vals / tl.sum(vals, 0)
    if LOCAL:  # another rank's expert -> num_local (skipped by the fused MoE kernel)
        rel = idxs - first_local
        idxs = tl.where((rel >= 0) & (rel < num_local), rel, num_local)
    keep = slots < TOP_K
    tl.store(W + row * TOP_K + slots, vals, mask=keep)
    tl.store(Ids + row * TOP_K + slots, idxs, mask=keep)


def topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                 local: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, E]`` logits -> ``(weights [T, k] fp32, ids [T, k] int32)``; ``local=(first,
    count)``: ids relative to ``first``, ``count`` for experts outside ``[first, first+count)``."""
    first, count = local if local is not None else (0, 0)
    tokens, experts = router_logits.shape
    assert router_logits.stride(1) == 1 and 0 < top_k <= experts
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=router_logits.device)
    if tokens:
        _topk_softmax_kernel[(tokens,)](
            router_logits, weights, ids, experts, router_logits.stride(0), first, count,
            TOP_K=top_k, BLOCK_E=triton.next_power_of_2(experts),
            BLOCK_K=triton.next_power_of_2(top_k), RENORM=renormalize, LOCAL=local is not None,
            num_warps=4 if experts >= 256 else 1)
    return weights, ids

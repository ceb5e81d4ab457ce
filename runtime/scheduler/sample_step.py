"""Turning a step's logits into next tokens and logprob entries for the requests of a batch.

Logprobs are log-softmax of the raw logits (before temperature and penalties), as the API says.
"""
from __future__ import annotations

import torch

from .req import Req


def sample_next(logits: torch.Tensor, reqs: list[Req]) -> list[int]:
    """One token per row of ``logits`` ([bs, vocab], fp32), following each request's params."""
    if all(r.sampling_params.is_greedy for r in reqs):
        return logits.argmax(dim=-1).tolist()
    out = []
    for row, req in zip(logits, reqs):
        out.append(_sample_one(row, req))
    return out


def _sample_one(row: torch.Tensor, req: Req) -> int:
    p = req.sampling_params
    if p.is_greedy:
        return int(row.argmax())
    row = row / p.temperature
    if p.top_k > 0:
        kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if p.min_p > 0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    if p.top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        drop = (sorted_p.cumsum(0) - sorted_p) > p.top_p
        probs = probs.scatter(0, idx, sorted_p.masked_fill(drop, 0.0))
    gen = None
    if p.seed is not None:
        gen = torch.Generator(device=row.device).manual_seed(p.seed + len(req.output_ids))
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen))


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                   top_k: int) -> tuple[list[float], list[list] | None]:
    """Logprob of ``targets[i]`` under row ``i``, and the ``top_k`` best (logprob, id) per row."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    picked = logp.gather(1, targets.view(-1, 1)).view(-1).tolist()
    if top_k <= 0:
        return picked, None
    vals, ids = logp.topk(top_k, dim=-1)
    tops = [list(zip(v, i)) for v, i in zip(vals.tolist(), ids.tolist())]
    return picked, tops

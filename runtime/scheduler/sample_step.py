"""Turning a step's logits into next tokens (through ``layers.sampler``) and logprob entries.

Logprobs are log-softmax of the raw logits (before temperature and penalties), as the API says.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..distributed import sampled_ids
from ..distributed.state import pp_place
from ..layers.sampler import Sampler, SamplingBatchInfo
from ..multimodal.inputs import text_ids
from .req import Req


class BatchSampler:
    """Samples with the runtime's batched Sampler; one SamplingBatchInfo per batch."""

    def __init__(self, eos_token_ids: Sequence[int], seed: int, device: torch.device) -> None:
        self.eos = tuple(eos_token_ids)
        self.sampler = Sampler(seed, device)

    def new_info(self, reqs: list[Req], vocab_size: int) -> SamplingBatchInfo:
        """Info for requests joining a batch; resumed requests bring their output so far
        (penalty counts and seeded step numbers continue where they were)."""
        return SamplingBatchInfo.from_params(
            [r.sampling_params for r in reqs], vocab_size, self.sampler.device, self.eos,
            prompt_ids=[text_ids(r) for r in reqs],  # mm: without image pad ids
            output_ids=[r.output_ids for r in reqs])

    def sample_ids(self, logits: torch.Tensor, info: SamplingBatchInfo,
                   vocab_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Next ids on the logits' device (no host sync); ``info`` advances one step.
        ``vocab_mask``: the grammar's packed int32 bitmask, rows aligned with the batch."""
        if pp_place()[0] == pp_place()[1] - 1:
            ids = self.sampler.sample(logits, info, vocab_mask)
        else:  # pp: no logits on this stage; rank 0 (last stage) sends its ids just below
            ids = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
        # tp-step: every TP rank sampled the same ids from the same all-gathered logits; no
        # broadcast (distributed/sampled_ids.py says why; pp still broadcasts)
        ids = sampled_ids.agree(ids)
        info.update(ids)
        return ids

    @staticmethod
    def greedy_only(info: SamplingBatchInfo) -> bool:
        """tp-step: every row's next id is the logits' argmax (greedy, no penalties) and no
        broadcast is owed; with no mask either, ``take_greedy`` takes a step graph's ids."""
        return info.all_greedy and info.penalties.is_empty and not sampled_ids.needs_broadcast()

    def take_greedy(self, ids: torch.Tensor, info: SamplingBatchInfo,
                    vocab_mask: torch.Tensor | None) -> torch.Tensor | None:
        """tp-step: a step graph's greedy ids when they are what ``sample_ids`` would draw
        (``greedy_only`` and no mask); ``info`` advances one step. None: sample the logits
        instead."""
        if vocab_mask is not None or not self.greedy_only(info):
            return None
        ids = sampled_ids.agree(ids)  # (``check``: the ranks still compared)
        info.update(ids)
        return ids

    def sample(self, logits: torch.Tensor, info: SamplingBatchInfo,
               vocab_mask: torch.Tensor | None = None) -> list[int]:
        return self.sample_ids(logits, info, vocab_mask).tolist()


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

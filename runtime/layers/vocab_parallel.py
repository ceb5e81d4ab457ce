"""Vocab-parallel embedding and LM head: the vocabulary is split into equal row blocks over the
TP ranks (padded with zero rows to a multiple of tp_size; at tp_size 1 no padding).

The embedding looks up the ids in this rank's block (zeros elsewhere) and all-reduces; the LM
head computes this rank's logit columns, which ``gather_logits`` all-gathers into
``[rows, vocab]`` so that every rank samples from the same full logits.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.collectives import all_gather, all_reduce
from ..distributed.state import get_tp_group
from .linear import LinearBase
from .quantization.base import QuantConfig
from .weight_slices import copy_checked, narrow


def padded_vocab(vocab_size: int, tp_size: int) -> int:
    return -(-vocab_size // tp_size) * tp_size


class VocabShard:
    """Rows ``[start, start + per_rank)`` of the padded vocab belong to this rank; the real
    (checkpoint) rows are ``[start, end)``."""

    def __init__(self, vocab_size: int) -> None:
        tp = get_tp_group()
        self.vocab_size, self.tp_size = vocab_size, tp.size
        self.per_rank = padded_vocab(vocab_size, tp.size) // tp.size
        self.start = tp.rank * self.per_rank
        self.end = min(self.start + self.per_rank, vocab_size)

    def load_rows(self, param: nn.Parameter, loaded: Any, what: str) -> None:
        """This rank's rows of the full ``[vocab, hidden]`` tensor; padding rows zero."""
        real = max(0, self.end - self.start)
        copy_checked(param.data[:real], narrow(loaded, 0, self.start, real), what)
        param.data[real:].zero_()


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.shard = VocabShard(num_embeddings)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(torch.empty(self.shard.per_rank, embedding_dim, dtype=dtype,
                                               device=device), requires_grad=False)
        self.weight.full_shape = (num_embeddings, embedding_dim)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        self.shard.load_rows(param, loaded, "embedding")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.shard.tp_size == 1:
            return F.embedding(ids, self.weight)
        s = self.shard
        mine = (ids >= s.start) & (ids < s.start + s.per_rank)
        out = F.embedding(torch.where(mine, ids - s.start, 0), self.weight)
        out.masked_fill_(~mine.unsqueeze(-1), 0)
        return all_reduce(out)


class ParallelLMHead(LinearBase):
    """The untied output projection: this rank's block of vocab rows (a column-parallel linear
    whose loader pads the last block)."""

    split_output = True

    def __init__(self, vocab_size: int, hidden_size: int, *, quant: QuantConfig | None = None,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        shard = VocabShard(vocab_size)
        super().__init__(hidden_size, vocab_size, False, in_per_rank=hidden_size,
                         out_per_rank=shard.per_rank, quant=quant, dtype=dtype, device=device)
        self.shard = shard
        self.weight.full_shape = (vocab_size, hidden_size)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        self.shard.load_rows(param, loaded, "lm_head")


_LOCAL = [False]  # tp-step: inside ``local_logits``


@contextlib.contextmanager
def local_logits() -> Iterator[None]:
    """tp-step: inside, ``gather_logits`` returns this rank's real columns (global ids from
    ``tp_rank * columns``) without the all-gather: the step graphs' greedy pick reduces each
    rank's columns first and exchanges one (value, id) pair per row (model/step_ops.py)."""
    _LOCAL[0] = True
    try:
        yield
    finally:
        _LOCAL[0] = False


def gather_logits(local: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """This rank's logit columns -> the full ``[rows, vocab]`` on every rank."""
    tp = get_tp_group()
    if tp.size == 1:
        return local
    if _LOCAL[0]:  # tp-step: the padding columns past the vocabulary dropped
        per = local.shape[-1]
        return local[:, :max(0, min(per, vocab_size - tp.rank * per))]
    return all_gather(local, -1)[:, :vocab_size]

"""Logit penalties that depend on what a request has generated so far, batched over requests.

Each penalizer keeps per-request tensors (one row per request), is built only when some request
in the batch needs it, is updated incrementally with each step's sampled tokens (``cumulate``),
and follows the batch through ``filter`` (requests leave) and ``merge`` (requests join). A batch
without a penalizer that the other batch has gets a neutral one, so merged rows stay aligned.

- frequency/presence (OpenAI semantics): over *output* tokens,
  ``logit -= frequency * count + presence * (count > 0)``.
- repetition (HF/vLLM semantics): over prompt and output tokens, ``logit / rp`` if positive else
  ``logit * rp``.
- min_new_tokens: EOS and stop_token_ids are masked until that many tokens were generated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..sampling_params import SamplingParams


@dataclass(frozen=True)
class PenaltyContext:
    """Everything a penalizer needs to build its rows for a group of requests."""

    params: Sequence[SamplingParams]
    vocab_size: int
    device: torch.device
    eos_token_ids: Sequence[int] = ()
    prompt_ids: Sequence[Sequence[int]] | None = None  # needed by the repetition penalty
    output_ids: Sequence[Sequence[int]] | None = None  # tokens already generated (resume)

    def outputs(self) -> list[Sequence[int]]:
        return list(self.output_ids) if self.output_ids is not None else [()] * len(self.params)

    def prompts(self) -> list[Sequence[int]]:
        return list(self.prompt_ids) if self.prompt_ids is not None else [()] * len(self.params)

    def token_matrix(self, rows: list[Sequence[int]], dtype: torch.dtype) -> torch.Tensor:
        """``[bs, vocab]`` counts (or presence, for bool) of the token ids of each row."""
        out = torch.zeros((len(rows), self.vocab_size), dtype=torch.int32, device=self.device)
        for i, ids in enumerate(rows):
            if len(ids):
                idx = torch.as_tensor(list(ids), dtype=torch.int64, device=self.device)
                out[i].index_add_(0, idx, torch.ones_like(idx, dtype=torch.int32))
        return out if dtype == torch.int32 else out > 0

    def column(self, values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=self.device).unsqueeze(1)


class Penalizer:
    """One penalty over a batch. Subclasses name their per-row tensors in ``_fields``."""

    _fields: tuple[str, ...] = ()

    @classmethod
    def build(cls, ctx: PenaltyContext) -> "Penalizer | None":
        """Rows for ``ctx``, or None when no request needs this penalty."""
        raise NotImplementedError

    @classmethod
    def neutral(cls, bs: int, vocab_size: int, device: torch.device) -> "Penalizer":
        """Rows that change nothing, to align with a batch that has this penalty."""
        raise NotImplementedError

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def cumulate(self, next_ids: torch.Tensor) -> None:
        raise NotImplementedError

    def filter(self, keep: torch.Tensor) -> None:
        for name in self._fields:
            setattr(self, name, getattr(self, name)[keep])

    def merge(self, other: "Penalizer") -> None:
        for name in self._fields:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))


class FrequencyPresencePenalizer(Penalizer):
    _fields = ("frequency", "presence", "counts")

    def __init__(self, frequency: torch.Tensor, presence: torch.Tensor, counts: torch.Tensor):
        self.frequency, self.presence, self.counts = frequency, presence, counts

    @classmethod
    def build(cls, ctx: PenaltyContext) -> "FrequencyPresencePenalizer | None":
        if all(p.frequency_penalty == 0 and p.presence_penalty == 0 for p in ctx.params):
            return None
        return cls(ctx.column([p.frequency_penalty for p in ctx.params]),
                   ctx.column([p.presence_penalty for p in ctx.params]),
                   ctx.token_matrix(ctx.outputs(), torch.int32))

    @classmethod
    def neutral(cls, bs: int, vocab_size: int, device: torch.device) -> "FrequencyPresencePenalizer":
        zeros = torch.zeros((bs, 1), dtype=torch.float32, device=device)
        return cls(zeros, zeros.clone(),
                   torch.zeros((bs, vocab_size), dtype=torch.int32, device=device))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits - self.frequency * self.counts - self.presence * (self.counts > 0)

    def cumulate(self, next_ids: torch.Tensor) -> None:
        rows = torch.arange(next_ids.numel(), device=self.counts.device)
        self.counts[rows, next_ids.to(self.counts.device)] += 1


class RepetitionPenalizer(Penalizer):
    _fields = ("penalty", "seen")

    def __init__(self, penalty: torch.Tensor, seen: torch.Tensor) -> None:
        self.penalty, self.seen = penalty, seen

    @classmethod
    def build(cls, ctx: PenaltyContext) -> "RepetitionPenalizer | None":
        if all(p.repetition_penalty == 1.0 for p in ctx.params):
            return None
        rows = [list(a) + list(b) for a, b in zip(ctx.prompts(), ctx.outputs())]
        return cls(ctx.column([p.repetition_penalty for p in ctx.params]),
                   ctx.token_matrix(rows, torch.bool))

    @classmethod
    def neutral(cls, bs: int, vocab_size: int, device: torch.device) -> "RepetitionPenalizer":
        return cls(torch.ones((bs, 1), dtype=torch.float32, device=device),
                   torch.zeros((bs, vocab_size), dtype=torch.bool, device=device))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        scaled = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
        return torch.where(self.seen, scaled, logits)

    def cumulate(self, next_ids: torch.Tensor) -> None:
        rows = torch.arange(next_ids.numel(), device=self.seen.device)
        self.seen[rows, next_ids.to(self.seen.device)] = True


class MinNewTokensPenalizer(Penalizer):
    _fields = ("min_new", "generated", "stop_mask")

    def __init__(self, min_new: torch.Tensor, generated: torch.Tensor, stop_mask: torch.Tensor):
        self.min_new, self.generated, self.stop_mask = min_new, generated, stop_mask

    @classmethod
    def build(cls, ctx: PenaltyContext) -> "MinNewTokensPenalizer | None":
        if all(p.min_new_tokens == 0 for p in ctx.params):
            return None
        stops = [[] if p.min_new_tokens == 0 else
                 [t for t in (*ctx.eos_token_ids, *p.stop_token_ids) if t < ctx.vocab_size]
                 for p in ctx.params]
        dev = ctx.device
        return cls(torch.tensor([p.min_new_tokens for p in ctx.params], device=dev),
                   torch.tensor([len(o) for o in ctx.outputs()], device=dev),
                   ctx.token_matrix(stops, torch.bool))

    @classmethod
    def neutral(cls, bs: int, vocab_size: int, device: torch.device) -> "MinNewTokensPenalizer":
        zeros = torch.zeros(bs, dtype=torch.int64, device=device)
        return cls(zeros, zeros.clone(),
                   torch.zeros((bs, vocab_size), dtype=torch.bool, device=device))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        active = (self.generated < self.min_new).unsqueeze(1)
        return logits.masked_fill(self.stop_mask & active, float("-inf"))

    def cumulate(self, next_ids: torch.Tensor) -> None:
        self.generated += 1


# NOTE: applied in this order (as vLLM does): repetition scales the raw logits, then the
# frequency/presence subtraction, then the min_new_tokens mask.
PENALIZERS: tuple[type[Penalizer], ...] = (
    RepetitionPenalizer, FrequencyPresencePenalizer, MinNewTokensPenalizer)


class Penalties:
    """The penalizers a batch needs, kept aligned with its rows."""

    def __init__(self, bs: int, vocab_size: int, device: torch.device,
                 active: dict[type[Penalizer], Penalizer]) -> None:
        self.bs, self.vocab_size, self.device = bs, vocab_size, device
        self.active = active

    @classmethod
    def build(cls, ctx: PenaltyContext) -> "Penalties":
        built = {kind: kind.build(ctx) for kind in PENALIZERS}
        return cls(len(ctx.params), ctx.vocab_size, ctx.device,
                   {k: v for k, v in built.items() if v is not None})

    @property
    def is_empty(self) -> bool:
        return not self.active

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Penalized copy of ``logits`` (the input is left untouched)."""
        for pen in self.active.values():
            logits = pen.apply(logits)
        return logits

    def cumulate(self, next_ids: torch.Tensor) -> None:
        for pen in self.active.values():
            pen.cumulate(next_ids)

    def filter(self, keep: torch.Tensor) -> None:
        for pen in self.active.values():
            pen.filter(keep.to(self.device))
        self.bs = int(keep.numel())

    def merge(self, other: "Penalties") -> None:
        merged: dict[type[Penalizer], Penalizer] = {}
        for kind in PENALIZERS:  # NOTE: fixed order: repetition and frequency do not commute
            if kind not in self.active and kind not in other.active:
                continue
            mine = self.active.get(kind) or kind.neutral(self.bs, self.vocab_size, self.device)
            mine.merge(other.active.get(kind) or kind.neutral(other.bs, self.vocab_size, self.device))
            merged[kind] = mine
        self.active = merged
        self.bs += other.bs

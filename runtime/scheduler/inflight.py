"""InflightStep: a launched forward whose sampled tokens the scheduler has not read yet.

With overlap scheduling the scheduler launches step t+1 (forward and sampling, queued on the
device) before it reads step t's tokens, so the host's bookkeeping for t (append tokens,
finish checks, outputs) runs while the device computes t+1. The record keeps what reading the
step needs: the requests as they were at launch (with their ``epoch``: one released meanwhile,
by a finish, abort or retraction, has its token dropped), which of them sampled, and the
sampled ids being copied to pinned host memory behind a CUDA event.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..model.forward_batch import ForwardMode
from .req import Req


class HostIds:
    """Sampled ids on their way to the host: the copy is queued behind the forward, and
    ``tolist`` waits only for it (not for work queued after it)."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.event = None
        if ids.device.type == "cuda":
            self.host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self.host.copy_(ids, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = ids

    def tolist(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


@dataclass
class InflightStep:
    mode: ForwardMode
    reqs: list[Req]  # every request of the forward, in batch order
    epochs: list[int]  # their epochs at launch
    sampled: list[Req] = field(default_factory=list)  # rows of ``ids``, a sub-list of reqs
    ids: HostIds | None = None
    info: Any = None  # extend: the SamplingBatchInfo of ``sampled`` (joins the running batch)
    # Only for steps read right after launch (logprobs): the logits are views into buffers
    # the next forward overwrites.
    sync: bool = True
    logits: torch.Tensor | None = None  # rows of ``sampled`` (decode: of reqs)
    extend_logits: torch.Tensor | None = None  # every logits row of an extend (prompt logprobs)
    layout: Any = None
    vocab_mask: Any = None  # grammar: the step's bitmask (set: its rows advance matchers)
    # spec: a speculative step's outputs, sent at its read (after the next launch, or while
    # the next verify runs on the device: runtime/speculative/decoder.py)
    spec_outputs: bool = False

    @classmethod
    def launched(cls, mode: ForwardMode, reqs: list[Req], sync: bool) -> "InflightStep":
        return cls(mode, reqs, [r.epoch for r in reqs], sync=sync)

    def any_live(self) -> bool:
        return any(r.epoch == e for r, e in zip(self.reqs, self.epochs))

    def live(self) -> list[Req]:
        """Requests not released since launch (their results still count)."""
        return [r for r, e in zip(self.reqs, self.epochs) if r.epoch == e]

"""pp: one pipeline stage's forward (``pipeline.py`` explains the split).

``ModelRunner.forward`` hands every batch here when pp_size > 1: a stage after the first
receives the previous stage's output for the batch, runs its layers (a decode batch replays the
stage's CUDA graph, whose static input holds the received tensor, as SGLang's PP graphs take
their "proxy tensors"), and a stage before the last sends its output on. A large batch goes
through as micro-batches, several in flight at once (``pipeline_micro.py``). The last stage
returns real logits; the others return ``placeholder_logits``, which the scheduler never
samples (``scheduler/sample_step.py`` takes rank 0's ids) and whose logprobs it never reports
(only rank 0, on the last stage, answers the main process).
"""
from __future__ import annotations

from typing import Any

import torch

from ..model.forward_batch import ForwardBatch
from . import pipeline
from .pipeline import PipelineStage
from .pipeline_micro import plan_parts, split


class StageForward:
    """The forward of one stage of ``runner`` (a ModelRunner)."""

    def __init__(self, runner: Any, stage: PipelineStage) -> None:
        self.runner = runner
        self.stage = stage
        self.hidden = runner.model_config.hidden_size
        self.vocab = runner.model_config.vocab_size
        config = runner.config
        self.micro_batches = config.pp_micro_batches or stage.size
        self.micro_tokens = config.pp_micro_batch_tokens

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The last stage's logits (or placeholders elsewhere) for ``batch``, run as
        micro-batches where it is large enough (``pipeline_micro.py``)."""
        ranges = plan_parts(batch, self.micro_batches, self.micro_tokens)
        parts = [batch] if len(ranges) == 1 else split(batch, ranges)
        stage = self.stage
        inbox = [] if stage.is_first else [
            pipeline.recv_prev((p.num_tokens, 2, self.hidden), self.runner.dtype,
                               self.runner.device) for p in parts]
        outs, sends = [], []
        for i, part in enumerate(parts):
            if inbox:
                part.pp_proxy, request = inbox[i]
                request.wait()
            out = self._run(part, copy=len(parts) > 1)
            if stage.is_last:
                outs.append(out)
            else:
                sends.append((pipeline.send_next(out), out))
        for request, _ in sends:  # NOTE: the outputs stay referenced until sent
            request.wait()
        if not stage.is_last:
            return self.placeholder_logits(batch)
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _run(self, part: ForwardBatch, copy: bool) -> torch.Tensor:
        """One (micro-)batch through this stage. ``copy``: a graph's output buffer is reused by
        the next replay, so a part's output is copied before the next part runs."""
        graphs = self.runner.cuda_graph_runner
        if graphs is not None and graphs.can_run(part):
            out = graphs.replay(part)
            return out.clone() if copy else out
        return self.runner.forward_eager(part)

    def placeholder_logits(self, batch: ForwardBatch) -> torch.Tensor:
        """Zeros of the logits' shape without their memory (one row, expanded)."""
        rows = (batch.logits_indices.numel() if batch.logits_indices is not None
                else batch.batch_size)
        row = torch.zeros((1, self.vocab), dtype=torch.float32, device=self.runner.device)
        return row.expand(rows, self.vocab)

    def static_proxy(self, max_bs: int) -> torch.Tensor | None:
        """The CUDA graphs' input buffer for the received hidden states (first stage: none)."""
        if self.stage.is_first:
            return None
        return torch.zeros((max_bs, 2, self.hidden), dtype=self.runner.dtype,
                           device=self.runner.device)

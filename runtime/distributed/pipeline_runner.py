"""pp: one pipeline stage's forward (``pipeline.py`` explains the split).

``ModelRunner.forward`` hands every batch here when pp_size > 1: a stage after the first
receives the previous stage's output for the batch, runs its layers (a decode batch replays the
stage's CUDA graph, whose static input holds the received tensor, as SGLang's PP graphs take
their "proxy tensors"), and a stage before the last sends its output on. The last stage
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


class StageForward:
    """The forward of one stage of ``runner`` (a ModelRunner)."""

    def __init__(self, runner: Any, stage: PipelineStage) -> None:
        self.runner = runner
        self.stage = stage
        self.hidden = runner.model_config.hidden_size
        self.vocab = runner.model_config.vocab_size

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The last stage's logits (or placeholders elsewhere) for ``batch``."""
        runner, stage = self.runner, self.stage
        if not stage.is_first:
            batch.pp_proxy = pipeline.recv_prev((batch.num_tokens, 2, self.hidden),
                                                runner.dtype, runner.device)
        graphs = runner.cuda_graph_runner
        if graphs is not None and graphs.can_run(batch):
            out = graphs.replay(batch)
        else:
            out = runner.forward_eager(batch)
        if stage.is_last:
            return out
        pipeline.send_next(out)
        return self.placeholder_logits(batch)

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

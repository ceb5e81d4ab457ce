"""CUDA graphs for an EAGLE / EAGLE3 head's draft steps (decode-row forwards).

Every draft level, and the feed of a speculative step's newly verified tokens (a few tokens
per request), is a DECODE batch of the head's own request table (``draft_batch.py``). One
step (token embedding, the head's layer over it and the given hidden states, the logits,
log-softmax, top-k and, for EAGLE3, the draft-to-target id map) is captured per row count of
the target's decode-graph sizes, with the target's ``CudaGraphRunner`` (static inputs,
padding, capture order); the hidden states are one more static input.

Padded rows (the graph runner's) decode token 0 at position 0 into the head pool's dummy slot
0 on table row 0, with a zero hidden state: they write nothing another row reads, and their
outputs are dropped. Batches that do not fit (an extend: a prompt's first feed; more rows
than captured) run eagerly, as without graphs.
"""
from __future__ import annotations

from typing import Any

import torch

from ..model.cuda_graph_runner import CudaGraphRunner, _slice
from ..model.forward_batch import ForwardBatch

# NOTE: more rows than this run eagerly (a large first feed); graph memory stays small.
MAX_GRAPH_ROWS = 512


class _HeadStep:
    """The "runner" the graph runner captures: one head step over decode rows, the hidden
    states read from the static buffer."""

    pipeline = None  # pp: never (the graph runner asks)

    def __init__(self, drafter: Any, hidden: torch.Tensor) -> None:
        self.drafter = drafter
        self.hidden = hidden
        self.device = drafter.device
        self.attn_backend = drafter.attn

    def forward_eager(self, batch: ForwardBatch) -> tuple[torch.Tensor, ...]:
        return self.drafter.step(batch, self.hidden[:batch.batch_size])


class HeadGraphs(CudaGraphRunner):
    """``run(batch, hidden) -> (top-k log-probs, top-k target ids, next hidden)`` per row."""

    def __init__(self, drafter: Any, max_rows: int) -> None:
        width = drafter.model_config.hidden_size
        self.hidden = torch.zeros(max_rows, width, dtype=drafter.dtype, device=drafter.device)
        super().__init__(_HeadStep(drafter, self.hidden), max_rows)
        self.shared = None  # NOTE: no cascade path: one layer, short sequences
        self.replays = 0

    @classmethod
    def create(cls, config: Any, drafter: Any, target: Any) -> "HeadGraphs | None":
        """Captured graphs when the target replays decode graphs (CUDA, triton, graphs on)."""
        if (getattr(target, "cuda_graph_runner", None) is None
                or config.speculative_disable_cuda_graph):
            return None
        reqs = min(config.max_running_requests, config.speculative_max_batch_size)
        rows = max(reqs, 1) * max(config.speculative_eagle_topk,
                                  config.speculative_num_draft_tokens + 1)
        graphs = cls(drafter, min(rows, MAX_GRAPH_ROWS))
        graphs.pool = target.cuda_graph_runner.pool  # NOTE: never replayed concurrently
        graphs.capture()
        return graphs

    def fits(self, batch: ForwardBatch) -> bool:
        return batch.mode.is_decode and batch.batch_size <= self.max_bs

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bs = batch.batch_size
        padded = self.load(batch)
        self.hidden[:bs].copy_(hidden)
        self.hidden[bs:padded].zero_()
        graph = self.graphs.get(padded)
        if graph is None:  # not captured (CPU): the computation a replay performs
            return _slice(self.runner.forward_eager(self.static_batch(padded)), bs)
        graph.replay()
        self.replays += 1
        return _slice(self.outputs[padded], bs)

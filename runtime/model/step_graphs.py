"""StepGraphs: decode graphs holding a plain decode step's device work, not only the forward.

A decode step used to queue ~17 small operations around the graph: the new KV slots' upload
and table write, the input gather, two position adds, five copies into the static buffers,
the greedy argmax (five kernels), the sampled ids' broadcast, their write into ``last_token``
and their copy to the host. Each ran in a few microseconds on the GPU, one after the other
between two replays (H200, 8B at TP=4, batch 1: ~70 us per token over the graph's ~1640).

Here a step (``step``) queues: one host-to-device copy of every index the step needs (request
rows, positions, sequence lengths, KV slots and where each row's id goes, packed into one
pinned buffer: ``meta``), the device table's write of the new slots, the gather of each
request's last token (its input), the graph, and the ids' copy to the host (the caller's).
The graph holds the forward, the logits, the greedy argmax and the write of the ids into
``last_token`` (the next step's inputs, by request row), so a greedy batch needs nothing
else; a batch that samples, masks or penalizes samples the returned logits as before and its
ids overwrite the graph's in ``last_token``.

Padded rows send their ids to ``last_token``'s last entry, a sink no request row owns. An
explicit replay (``replay``: jump-forward rows, speculative verify, pipeline parts) returns
the logits only and first points every row at the sink, so it never writes ``last_token``.

Without captured graphs (a CPU, or ``$SGDSL_DECODE_STEP=eager``) ``step`` runs the same
computation eagerly on the same buffers, unpadded: the CPU tests run this path.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from ..layers.attention.shared_prefix import SharedPrefix
from ..layers.sampler import greedy_argmax
from .cuda_graph_runner import CudaGraphRunner, _slice
from .forward_batch import ForwardBatch

# rows of ``meta``: the static inputs of the base class, plus where each row's id goes
ROWS, POS, LENS, LOCS, DEST = range(5)
MODES = ("graph", "eager", "off")


def step_mode() -> str:
    """``$SGDSL_DECODE_STEP``: ``graph`` (default: the step graphs where decode graphs are
    captured), ``eager`` (also without graphs, e.g. on a CPU: tests) or ``off`` (the plain
    decode graphs and the per-step work outside them, as before)."""
    mode = os.environ.get("SGDSL_DECODE_STEP", "graph") or "graph"
    if mode not in MODES:
        raise ValueError(f"SGDSL_DECODE_STEP={mode!r}: expected one of {', '.join(MODES)}")
    return mode


class StepGraphs(CudaGraphRunner):
    """Decode graphs of ``runner`` whose output is ``(logits, greedy ids)``; ``step`` runs a
    whole plain decode step, ``replay`` an explicit batch (logits only)."""

    def __init__(self, runner: Any, max_bs: int) -> None:
        super().__init__(runner, max_bs)
        self.last_token: torch.Tensor = runner.last_token
        self.sink = self.last_token.shape[0] - 1
        dev = runner.device
        self.meta = torch.zeros(5, max_bs, dtype=torch.int64, device=dev)
        self.meta[LENS].fill_(1)
        self.meta[DEST].fill_(self.sink)
        # the static inputs the graphs read become rows of ``meta``: one copy fills them all
        (self.req_pool_indices, self.positions, self.seq_lens, self.out_cache_loc,
         self.dest) = self.meta.unbind(0)
        pin = dev.type == "cuda"
        self._host = [torch.zeros(5, max_bs, dtype=torch.int64, pin_memory=pin)
                      for _ in range(2)]
        self._events: list[Any] = [None, None]
        self._turn = 0
        self._dest_live = False  # ``dest`` names live rows (set by ``step``)
        self.pad_eager = False  # tests: pad rows as a replay would, without graphs

    def _run(self, batch: ForwardBatch) -> Any:
        logits = self.runner.forward_eager(batch)
        ids = greedy_argmax(logits)
        # padded rows (and every row of an explicit replay) write the sink
        self.last_token.index_copy_(0, self.dest[:batch.batch_size], ids)
        return logits, ids

    def replay(self, batch: ForwardBatch) -> Any:
        """Logits ``[bs, vocab]`` of an explicit decode batch (its ids go nowhere)."""
        padded = self.load(batch)
        self.graphs[padded].replay()
        return _slice(self.outputs[padded][0], batch.batch_size)

    def load(self, batch: ForwardBatch) -> int:
        if self._dest_live:
            self.dest.fill_(self.sink)
            self._dest_live = False
        return super().load(batch)

    def fits(self, bs: int) -> bool:
        return bs <= self.max_bs

    @torch.inference_mode()
    def step(self, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
             shared: SharedPrefix | None,
             write_table: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of the requests in table ``rows`` (host int64) feeding their last
        token at ``positions`` into KV ``slots`` (host): ``(logits, greedy ids)`` on the
        device, views valid until the next replay. ``write_table(rows, cols, slots)`` (device
        tensors) writes the device's request->slot table where it is not the host's."""
        bs = int(rows.numel())
        padded = self.padded_size(bs) if self.graphs or self.pad_eager else bs
        self._upload(rows, positions, slots, bs, padded)
        write_table(self.req_pool_indices[:bs], self.positions[:bs], self.out_cache_loc[:bs])
        torch.index_select(self.last_token, 0, self.req_pool_indices[:padded],
                           out=self.input_ids[:padded])
        self._copy_shared(shared, bs, padded)
        graph = self.graphs.get(padded)
        if graph is None:  # not captured: the computation a replay performs
            return _slice(self._run(self.static_batch(padded)), bs)
        graph.replay()
        return _slice(self.outputs[padded], bs)

    def _upload(self, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                bs: int, padded: int) -> None:
        """``meta`` := the step's indices, padded rows pointing at the dummy slot and the sink,
        in one copy from a pinned buffer. Two buffers alternate: one is refilled only once
        the copy queued from it a step earlier is done (its event)."""
        i = self._turn
        self._turn ^= 1
        if self._events[i] is not None:
            self._events[i].synchronize()  # long done: a whole step ago
        host = self._host[i]
        h = host.numpy()
        h[ROWS, :bs] = rows.numpy()
        h[POS, :bs] = positions.numpy()
        h[LENS, :bs] = h[POS, :bs] + 1
        h[LOCS, :bs] = slots.numpy()
        h[DEST, :bs] = h[ROWS, :bs]
        if padded > bs:  # padded rows: row 0, position 0, length 1, slot 0 (dummy), sink
            h[:, bs:padded] = 0
            h[LENS, bs:padded] = 1
            h[DEST, bs:padded] = self.sink
        self.meta.copy_(host, non_blocking=True)
        self._dest_live = True
        if host.is_pinned():
            event = self._events[i] = torch.cuda.Event()
            event.record()

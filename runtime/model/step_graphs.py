"""StepGraphs: decode graphs holding a plain decode step's device work, not only the forward.

A decode step used to queue ~17 small operations around the graph: the new KV slots' upload
and table write, the input gather, two position adds, five copies into the static buffers,
the greedy argmax (five kernels), the sampled ids' broadcast, their write into ``last_token``
and their copy to the host. Each ran in a few microseconds on the GPU, one after the other
between two replays (H200, 8B at TP=4, batch 1: ~70 us per token over the graph's ~1640).

Here a step (``step``) queues one host-to-device copy of every index the step needs (request
rows, positions, sequence lengths, KV slots, where each row's id goes and the host ring's
slot, packed into one pinned buffer: ``meta``), then the graph. The graph holds, around the
forward, ``prepare`` (the new slots into the device's request->slot table, each request's
last token as its input) and ``finish`` (the greedy argmax, the ids into ``last_token``, the
next step's inputs by request row, and into a page-locked host ring the scheduler reads after
an event): model/step_ops.py, one Triton kernel each on CUDA. A greedy batch needs nothing
else; a batch that samples, masks or penalizes samples the returned logits as before and its
ids overwrite the graph's in ``last_token``.

Under TP, an all-greedy step whose logits nothing reads (``step(greedy_only=True)``, batches
up to ``LOCAL_MAX_BS``) replays a second graph that keeps the logits on their ranks: each rank
picks its columns' maximum and the ranks exchange one (value, id) pair per row instead of
all-gathering the logits (step_ops.pick_local; ``$SGDSL_LOCAL_GREEDY=0`` turns it off, ``=1`` on;
on CUDA it is off by default until a GPU run has tested it).

Padded rows send their ids to ``last_token``'s last entry, a sink no request row owns, and
write neither the table nor the ring. An explicit replay (``replay``: jump-forward rows,
speculative verify) returns the logits only and first points every row at the sink, so it
writes no ids, no table entry and no ring slot.

Without captured graphs (a CPU, or ``$SGDSL_DECODE_STEP=eager``) ``step`` runs the same
computation eagerly on the same buffers, unpadded: the CPU tests run this path.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch

from ..layers.attention.shared_prefix import SharedPrefix
from ..layers.moe.dispatch import padded_layout
from ..layers.vocab_parallel import local_logits, padded_vocab
from . import step_ops
from .cuda_graph_runner import CudaGraphRunner, _slice
from .forward_batch import ForwardBatch
from .step_ops import DEST, LENS, LOCS, POS, ROWS, SLOT

logger = logging.getLogger(__name__)

MODES = ("graph", "eager", "off")
# host ring slots: a step's ids stay there until this many later steps (the scheduler reads a
# step before it launches the one after next: one slot would do with two)
RING = 4
# tp-step: greedy-only graphs (no logits all-gather) for batches up to this size, where a
# step's latency is what counts
LOCAL_MAX_BS = 8


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
        self.table = runner.req_to_token_pool.req_to_token
        self.meta = torch.zeros(6, max_bs, dtype=torch.int64, device=dev)
        self.meta[LENS].fill_(1)
        self.meta[DEST].fill_(self.sink)
        # the static inputs the graphs read become rows of ``meta``: one copy fills them all
        (self.req_pool_indices, self.positions, self.seq_lens, self.out_cache_loc,
         self.dest, _) = self.meta.unbind(0)
        pin = dev.type == "cuda"
        self._host = [torch.zeros(6, max_bs, dtype=torch.int64, pin_memory=pin)
                      for _ in range(2)]
        self._events: list[Any] = [None, None]
        self._turn = 0
        self._slot = 0  # the host ring's slot of the next step
        self._dest_live = False  # ``dest`` names live rows (set by ``step``)
        self.pad_eager = False  # tests: pad rows as a replay would, without graphs
        self.ring = self._make_ring(max_bs)
        self.local = self._local_offset()  # greedy pick from each rank's columns, or None
        self.greedy_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.greedy_outputs: dict[int, torch.Tensor] = {}

    def _local_offset(self) -> int | None:
        """The first vocabulary id of this rank's logit columns when an all-greedy step may
        skip the logits' all-gather (TP > 1; on CUDA a power-of-2 TP size, the finish
        kernel's width; ``$SGDSL_LOCAL_GREEDY=0``: never; on CUDA only with ``=1``); None otherwise."""
        r, vocab = self.runner, getattr(getattr(self.runner, "model_config", None),
                                        "vocab_size", None)
        tp = getattr(r, "tp_size", 1)
        # NOTE: on CUDA off unless asked (``=1``) until a GPU run has tested and measured it:
        # it landed after the last one (benchmarks/RESULTS.md, tp-step's section)
        flag = os.environ.get("SGDSL_LOCAL_GREEDY", "0" if r.device.type == "cuda" else "1")
        if (tp == 1 or vocab is None or flag == "0"
                or (r.device.type == "cuda" and tp & (tp - 1))):
            return None
        self.local_width = padded_vocab(vocab, tp) // tp  # columns per rank
        return r.tp_rank * self.local_width

    def _make_ring(self, max_bs: int) -> torch.Tensor | None:
        """The page-locked host ring the graphs write the ids into (None: the caller copies
        them); on CUDA probed once (the kernel must reach host memory over UVA)."""
        dev = self.runner.device
        vocab = getattr(getattr(self.runner, "model_config", None), "vocab_size", None)
        if vocab is None or not step_ops.ring_ok(dev, vocab):
            return None
        ring = torch.zeros(RING, max_bs, dtype=torch.int64, pin_memory=dev.type == "cuda")
        if dev.type != "cuda":
            return ring
        try:  # row 0 of a one-row step of logits [1, vocab] whose maximum is at vocab - 1
            probe = self.meta.clone()
            probe[DEST, 0], probe[SLOT, 0] = 0, 1
            logits = torch.arange(vocab, dtype=torch.float32, device=dev).view(1, -1)
            step_ops.finish(logits, probe, torch.zeros(2, dtype=torch.int64, device=dev),
                            ring, self.sink)
            torch.cuda.synchronize(dev)
            if int(ring[1, 0]) == vocab - 1:
                ring.zero_()
                return ring
            logger.warning("step graphs: the host ring probe read %d; ids copied instead",
                           int(ring[1, 0]))
        except Exception as exc:  # noqa: BLE001 - any failure: the copy path instead
            logger.warning("step graphs: no host ring (%s); ids copied instead", exc)
        return None

    def _run(self, batch: ForwardBatch) -> Any:
        n = batch.batch_size
        step_ops.prepare(self.meta, n, self.last_token, self.table, self.input_ids, self.sink)
        logits = self.runner.forward_eager(batch)
        if self.ring is not None and not step_ops.ring_ok(logits.device, logits.shape[-1]):
            self.ring = None  # logits wider than the config's vocab, unsplit: ids copied
        # padded rows (and every row of an explicit replay) write the sink, not the ring
        return logits, step_ops.finish(logits, self.meta, self.last_token, self.ring,
                                       self.sink)

    def _run_greedy(self, batch: ForwardBatch) -> torch.Tensor:
        """``_run`` for an all-greedy batch under TP: ids only, picked from each rank's logit
        columns with one (value, id) pair per row exchanged (step_ops.pick_local)."""
        step_ops.prepare(self.meta, batch.batch_size, self.last_token, self.table,
                         self.input_ids, self.sink)
        with local_logits():
            local = self.runner.forward_eager(batch)
        if local.shape[-1] > self.local_width:  # a model that gathers its logits elsewhere
            return step_ops.finish(local, self.meta, self.last_token, self.ring, self.sink)
        return step_ops.pick_local(local, self.local, self.meta, self.last_token, self.ring,
                                   self.sink)

    @torch.inference_mode()
    def capture(self) -> None:
        super().capture()
        if self.local is None:
            return
        stream = torch.cuda.Stream(self.runner.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), padded_layout():
            for bs in reversed([s for s in self.batch_sizes if s <= LOCAL_MAX_BS]):
                batch = self._static_batch(bs)
                for _ in range(2):
                    self._run_greedy(batch)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    self.greedy_outputs[bs] = self._run_greedy(batch)
                self.greedy_graphs[bs] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize(self.runner.device)

    def replay(self, batch: ForwardBatch) -> Any:
        """Logits ``[bs, vocab]`` of an explicit decode batch (its ids go nowhere)."""
        padded = self.load(batch)
        self.replay_graph(padded, batch.batch_size)
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
             shared: SharedPrefix | None, greedy_only: bool = False
             ) -> tuple[torch.Tensor | None, torch.Tensor, Any]:
        """One decode step of the requests in table ``rows`` (host int64) feeding their last
        token at ``positions`` into KV ``slots`` (host): ``(logits, greedy ids, host ids)``,
        the first two views on the device valid until the next replay, the last the ids on
        their way to the host (``tolist``; None without a ring: the caller copies them).
        ``greedy_only`` (every row greedy, nothing reads the logits): under TP the logits may
        stay on their ranks (``_run_greedy``), and then come back None."""
        bs = int(rows.numel())
        padded = self.padded_size(bs) if self.graphs or self.pad_eager else bs
        slot = self._slot
        self._slot = (slot + 1) % RING
        self._upload(rows, positions, slots, bs, padded, slot)
        self._copy_shared(shared, bs, padded)
        local = greedy_only and self.local is not None and (
            padded in self.greedy_graphs or not self.graphs)
        if local and padded in self.greedy_graphs:
            self.replay_graph(padded, bs, self.greedy_graphs)
            logits, ids = None, self.greedy_outputs[padded][:bs]
        elif local:  # not captured: the computation a replay performs
            logits, ids = None, self._run_greedy(self.static_batch(padded))[:bs]
        elif padded not in self.graphs:
            logits, ids = _slice(self._run(self.static_batch(padded)), bs)
        else:
            self.replay_graph(padded, bs)
            logits, ids = _slice(self.outputs[padded], bs)
        host = None if self.ring is None else RingIds(self.ring[slot, :bs])
        return logits, ids, host

    def _upload(self, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                bs: int, padded: int, slot: int) -> None:
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
        h[SLOT, 0] = slot
        if padded > bs:  # padded rows: row 0, position 0, length 1, slot 0 (dummy), sink
            h[:SLOT, bs:padded] = 0
            h[LENS, bs:padded] = 1
            h[DEST, bs:padded] = self.sink
        self.meta.copy_(host, non_blocking=True)
        self._dest_live = True
        if host.is_pinned():
            event = self._events[i] = torch.cuda.Event()
            event.record()


class RingIds:
    """A step's greedy ids in the host ring, written by the graph itself: ``tolist`` waits for
    the graph (an event recorded after it; on a CPU the ids are there already)."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host
        self.event = None
        if host.is_pinned():
            self.event = torch.cuda.Event()
            self.event.record()

    def tolist(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()

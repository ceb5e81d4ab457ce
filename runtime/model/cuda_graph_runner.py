"""CUDA graphs for decode: one captured graph per batch size in a fixed set; a decode batch is
padded up to the next captured size and replayed, so a whole decode step (every layer, the
attention metadata, the final norm, the logits and, when given, the sampler) runs as one graph
launch with no Python per layer.

Inputs live in static buffers the graphs were captured on; ``replay`` copies the batch into
them. Padded rows decode a dummy token into KV slot 0 (the pool's reserved dummy row) with
sequence length 1, and their outputs are dropped. NOTE: they name request row 0, which a live
request may own: anything a model gathers by request row (Qwen2.5-VL's M-RoPE ``row_delta``)
must stay in range for position 0 with that row's values.

With a backend that reads shared prefixes once per group (``prefix_members``, triton), the
graphs are captured on the cascade path with static ``SharedPrefix`` buffers; a batch without
groups replays them with empty tiles (every request's prefix length 0), which computes the
same attention as plain decode.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..layers.attention.shared_prefix import SharedPrefix, max_tiles
from ..layers.moe.dispatch import padded_layout
from .forward_batch import ForwardBatch, ForwardMode
from .step_timeline import StepTimeline

logger = logging.getLogger(__name__)

# NOTE: smaller graphs are captured without the cascade path: few requests rarely share a
# prefix, and its extra launches (~2% of a batch-1 Llama-3.1-8B step) would cost every step.
CASCADE_MIN_BS = 16

# (logits [bs, vocab] fp32) -> anything made of tensors; captured after the logits.
SampleFn = Callable[[torch.Tensor], Any]


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 256, then every 16: padding wastes at most ~1/8."""
    sizes = [1, 2, 4, 8] + list(range(16, 257, 8)) + list(range(272, 1025, 16))
    return [s for s in sizes if s < max_bs] + [max_bs]


class CudaGraphRunner:
    """Captures and replays decode forwards of ``runner`` (a ModelRunner on CUDA whose
    attention backend computes decode metadata without host syncs, i.e. ``triton``)."""

    def __init__(self, runner: Any, max_bs: int, sample_fn: SampleFn | None = None) -> None:
        self.runner = runner
        self.sample_fn = sample_fn
        self.batch_sizes = capture_batch_sizes(max_bs)
        self.max_bs = max_bs
        dev = runner.device
        i64 = dict(dtype=torch.int64, device=dev)
        self.input_ids = torch.zeros(max_bs, **i64)
        self.positions = torch.zeros(max_bs, **i64)
        self.req_pool_indices = torch.zeros(max_bs, **i64)
        self.seq_lens = torch.ones(max_bs, **i64)
        self.out_cache_loc = torch.zeros(max_bs, **i64)  # slot 0: the dummy row
        self.ones = torch.ones(max_bs, **i64)
        self.arange = torch.arange(max_bs, **i64)
        members = getattr(runner.attn_backend, "prefix_members", None)
        self.shared = None if members is None else SharedPrefix(
            torch.zeros(max_bs, **i64), torch.zeros(max_tiles(max_bs), **i64),
            torch.zeros(max_tiles(max_bs), **i64),
            torch.full((max_tiles(max_bs), members), -1, **i64))
        self._shared_src: Any = None  # the SharedPrefix last copied in (None: empty tiles)
        # pp: a later pipeline stage's input, the previous stage's output (None: first stage)
        pipe = getattr(runner, "pipeline", None)
        self.pp_proxy = pipe.static_proxy(max_bs) if pipe is not None else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Any] = {}
        self.pool = None
        self.timeline = StepTimeline.from_env(runner)  # tp-step: $SGDSL_STEP_TIMELINE

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            mode=ForwardMode.DECODE, batch_size=bs, input_ids=self.input_ids[:bs],
            positions=self.positions[:bs], req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs], out_cache_loc=self.out_cache_loc[:bs],
            # positions == seq_len - 1 == prefix length for a decode token
            extend_prefix_lens=self.positions[:bs], extend_seq_lens=self.ones[:bs],
            extend_start_loc=self.arange[:bs], shared_prefix=self._shared_view(bs),
            pp_proxy=None if self.pp_proxy is None else self.pp_proxy[:bs])  # pp:

    def _shared_view(self, bs: int) -> SharedPrefix | None:
        s, t = self.shared, max_tiles(bs)
        if s is None or bs < CASCADE_MIN_BS:
            return None
        return SharedPrefix(s.prefix_lens[:bs], s.tile_rows[:t], s.tile_lens[:t],
                            s.tile_members[:t])

    def _copy_shared(self, src: SharedPrefix | None, bs: int, padded: int) -> None:
        """Static prefix buffers := ``src`` (None: no groups); padded rows/tiles are empty."""
        s = self.shared
        if s is None or padded < CASCADE_MIN_BS or src is self._shared_src:
            return  # NOTE: the scheduler reuses one SharedPrefix until its batch changes
        self._shared_src = src
        t = 0 if src is None else int(src.tile_rows.shape[0])
        s.prefix_lens.zero_()
        s.tile_lens.zero_()
        s.tile_members.fill_(-1)
        if src is not None:
            assert t <= max_tiles(padded), "more shared-prefix tiles than the graph has"
            s.prefix_lens[:bs].copy_(src.prefix_lens, non_blocking=True)
            s.tile_rows[:t].copy_(src.tile_rows, non_blocking=True)
            s.tile_lens[:t].copy_(src.tile_lens, non_blocking=True)
            s.tile_members[:t].copy_(src.tile_members, non_blocking=True)

    def _run(self, batch: ForwardBatch) -> Any:
        logits = self.runner.forward_eager(batch)
        return (logits, self.sample_fn(logits)) if self.sample_fn else logits

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first so smaller graphs reuse its memory pool."""
        self.runner.attn_backend.init_cuda_graph_state(self.max_bs)
        stream = torch.cuda.Stream(self.runner.device)
        stream.wait_stream(torch.cuda.current_stream())
        # padded_layout: expert-parallel all-to-alls with equal splits (no host sync)
        with torch.cuda.stream(stream), padded_layout():
            for bs in reversed(self.batch_sizes):
                batch = self._static_batch(bs)
                for _ in range(2):  # warm up: Triton compiles, cuBLAS picks kernels
                    self._run(batch)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    self.outputs[bs] = self._run(batch)
                self.pool = graph.pool()
                self.graphs[bs] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize(self.runner.device)
        logger.info("captured decode CUDA graphs for batch sizes %s", self.batch_sizes)

    def can_run(self, batch: ForwardBatch) -> bool:
        return (batch.mode.is_decode and batch.batch_size <= self.max_bs
                and batch.logits_indices is None and bool(self.graphs))

    def padded_size(self, bs: int) -> int:
        return next(s for s in self.batch_sizes if s >= bs)

    def replay(self, batch: ForwardBatch) -> Any:
        """Logits ``[bs, vocab]`` (or ``(logits, sample_fn output)``) for a decode batch; the
        outputs are views into static buffers, valid until the next replay."""
        padded = self.load(batch)
        self.replay_graph(padded, batch.batch_size)
        return _slice(self.outputs[padded], batch.batch_size)

    def replay_graph(self, padded: int, rows: int, graphs: dict | None = None) -> None:
        """Replay the graph of size ``padded`` (of ``graphs``, default the decode graphs;
        tp-step: timed under $SGDSL_STEP_TIMELINE)."""
        mark = self.timeline.before() if self.timeline is not None else None
        (self.graphs if graphs is None else graphs)[padded].replay()
        if mark is not None:
            self.timeline.after(mark, rows)

    def static_batch(self, padded: int) -> ForwardBatch:
        """The batch the graph of size ``padded`` was captured on (its static buffers)."""
        return self._static_batch(padded)

    def load(self, batch: ForwardBatch) -> int:
        """Copy ``batch`` into the static buffers, padding rows up to the next captured size;
        returns that size. (Works on any device: the CPU tests run ``forward_eager`` on
        ``static_batch(load(batch))``, the computation a replay performs.)"""
        bs = batch.batch_size
        padded = self.padded_size(bs)
        if padded != bs:
            self.seq_lens[bs:padded].fill_(1)
            self.positions[bs:padded].zero_()
            self.out_cache_loc[bs:padded].zero_()
            self.req_pool_indices[bs:padded].zero_()
        self.input_ids[:bs].copy_(batch.input_ids, non_blocking=True)
        self.positions[:bs].copy_(batch.positions, non_blocking=True)
        self.req_pool_indices[:bs].copy_(batch.req_pool_indices, non_blocking=True)
        self.seq_lens[:bs].copy_(batch.seq_lens, non_blocking=True)
        self.out_cache_loc[:bs].copy_(batch.out_cache_loc, non_blocking=True)
        self._copy_shared(batch.shared_prefix, bs, padded)
        if self.pp_proxy is not None:  # pp: (padded rows keep stale values; dropped)
            self.pp_proxy[:bs].copy_(batch.pp_proxy, non_blocking=True)
        return padded


def _slice(out: Any, bs: int) -> Any:
    """First bs rows of every tensor in a (nested) tuple/list output."""
    if isinstance(out, torch.Tensor):
        return out[:bs] if out.dim() > 0 else out
    if isinstance(out, (tuple, list)):
        return type(out)(_slice(o, bs) for o in out)
    return out

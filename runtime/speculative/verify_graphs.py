"""CUDA graphs for the tree verify forward (``TARGET_VERIFY``): one graph per captured batch
size ``P`` (the decode graphs' sizes), each request given a fixed block of ``width`` rows
(``num_draft_tokens + 1``: the root and up to ``num_draft_tokens`` nodes).

A verify batch is ragged (request i feeds ``n_i = f_i + len(tree_i) <= width`` tokens); ``load``
scatters its rows into the padded layout (request i's token j at row ``i * width + j``), its
tree masks into ``width x width`` blocks, and pads up to ``P`` requests. Padding is inert:

- padded rows (past ``n_i`` in a request's block, and every row of a padded request) write
  their KV (and an EAGLE target's captured hidden state) to slot 0, the pool's dummy row;
- no real row attends to a padded row (their mask columns are 0), and a padded row attends
  to itself only among the new tokens (its mask's diagonal), so its softmax is never empty;
- a padded request has prefix length 0: it reads no request-table row (unlike padded decode
  rows, which read row 0's first slot; a previous VLM bug came from such a shared row 0).

The graph computes logits for every padded row; ``run`` gathers the real rows back in the
ragged order, so the caller sees exactly what ``ModelRunner.forward`` would return.
``run`` without captured graphs (the CPU tests) computes the same padded forward eagerly.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from ..layers.moe.dispatch import padded_layout
from ..layers.upload import to_device
from ..model.cuda_graph_runner import capture_batch_sizes
from ..model.forward_batch import ForwardBatch, ForwardMode
from .verify_batch import TreeMask

logger = logging.getLogger(__name__)

# NOTE: each captured size keeps its own fp32 logits output (rows x vocab); batches of more
# rows than this run eagerly (at 4 draft tokens: 51 requests, above the default 32 that
# speculate; at 64 draft tokens: 3).
MAX_GRAPH_ROWS = 256


def padded_rows(lens: Sequence[int], width: int) -> list[int]:
    """Row of each fed token in the padded layout (request i's token j: ``i * width + j``)."""
    return [i * width + j for i, n in enumerate(lens) for j in range(n)]


def mask_cells(lens: Sequence[int], width: int) -> list[int]:
    """Index into the padded flat masks (``[bs, width, width]`` row-major) of every cell of
    the ragged masks, in ``TreeMask.flat``'s order (request by request, ``[n, n]`` row-major)."""
    w2 = width * width
    return [i * w2 + a * width + b for i, n in enumerate(lens) for a in range(n)
            for b in range(n)]


def fits(lens: Sequence[int], prefix: Sequence[int], width: int, max_bs: int,
         context_len: int) -> bool:
    """Whether a verify batch fits the captured shapes: few enough requests, each feeding at
    most ``width`` tokens (jump-forward tokens fed ahead of a root may not), and its padded
    block within the context (the request table's width)."""
    return (0 < len(lens) <= max_bs and max(lens) <= width
            and max(prefix) + width <= context_len)


class VerifyGraphs:
    def __init__(self, runner: Any, max_bs: int, width: int) -> None:
        self.runner = runner
        self.width = width
        self.max_bs = max_bs
        self.batch_sizes = capture_batch_sizes(max_bs)
        dev = runner.device
        i64 = dict(dtype=torch.int64, device=dev)
        rows, w2 = max_bs * width, width * width
        self.input_ids = torch.zeros(rows, **i64)
        self.positions = torch.zeros(rows, **i64)
        self.out_cache_loc = torch.zeros(rows, **i64)  # slot 0: the dummy row
        self.logits_rows = torch.arange(rows, **i64)
        self.req_pool_indices = torch.zeros(max_bs, **i64)
        self.prefix_lens = torch.zeros(max_bs, **i64)
        self.seq_lens = torch.full((max_bs,), width, **i64)
        self.extend_lens = torch.full((max_bs,), width, **i64)
        self.start_loc = torch.arange(max_bs, **i64) * width
        self.mask_starts = torch.arange(max_bs, **i64) * w2
        # every block's diagonal: what a padded row sees (real cells are written over it)
        self.diag = torch.eye(width, dtype=torch.bool, device=dev).flatten().repeat(max_bs)
        self.mask = self.diag.clone()
        self.graphs: dict[int, Any] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.replays = 0  # graph launches (spec_verify_graph_steps)

    @classmethod
    def create(cls, config: Any, runner: Any) -> "VerifyGraphs | None":
        """Captured graphs when the target replays decode graphs and drafts may branch (NGRAM
        with bfs breadth > 1, EAGLE topk > 1; chains verify on the decode graphs)."""
        if (getattr(runner, "cuda_graph_runner", None) is None
                or config.speculative_disable_cuda_graph):
            return None
        trees = (config.speculative_eagle_topk > 1 if config.speculative_algorithm != "NGRAM"
                 else config.speculative_ngram_max_bfs_breadth > 1)
        if not trees:
            return None
        width = config.speculative_num_draft_tokens + 1
        max_bs = min(config.max_running_requests, config.speculative_max_batch_size,
                     MAX_GRAPH_ROWS // width)
        graphs = cls(runner, max(max_bs, 1), width)
        graphs.pool = runner.cuda_graph_runner.pool  # NOTE: never replayed concurrently
        graphs.capture()
        return graphs

    # -- shapes ---------------------------------------------------------------------------
    def padded_size(self, bs: int) -> int:
        return next(s for s in self.batch_sizes if s >= bs)

    def can_run(self, batch: ForwardBatch) -> bool:
        return (batch.mode is ForwardMode.TARGET_VERIFY and batch.spec_info is not None
                and fits(batch.extend_seq_lens_cpu, batch.extend_prefix_lens_cpu, self.width,
                         self.max_bs, self.runner.context_len))

    def static_batch(self, bs: int) -> ForwardBatch:
        """The batch of ``bs`` padded requests the graph of that size runs (static buffers)."""
        w, n = self.width, bs * self.width
        w2 = w * w
        masks = [self.mask[i * w2:(i + 1) * w2].view(w, w) for i in range(bs)]
        return ForwardBatch(
            mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=self.input_ids[:n],
            positions=self.positions[:n], req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs], out_cache_loc=self.out_cache_loc[:n],
            extend_prefix_lens=self.prefix_lens[:bs], extend_seq_lens=self.extend_lens[:bs],
            extend_start_loc=self.start_loc[:bs], logits_indices=self.logits_rows[:n],
            # NOTE: only the lengths are static; the prefixes are read from the device
            extend_seq_lens_cpu=[w] * bs,
            spec_info=TreeMask(masks, self.mask[:bs * w2], self.mask_starts[:bs]))

    # -- one verify forward ------------------------------------------------------------------
    def load(self, batch: ForwardBatch) -> tuple[int, torch.Tensor]:
        """Scatter ``batch`` into the static buffers (see module docstring): the padded size
        and, on the device, the padded row of each of the batch's rows."""
        bs, w = batch.batch_size, self.width
        lens = batch.extend_seq_lens_cpu
        padded = self.padded_size(bs)
        rows, cells = padded_rows(lens, w), mask_cells(lens, w)
        index = to_device(torch.tensor(rows + cells, dtype=torch.int64), self.runner.device)
        rows_d, cells_d = index.split([len(rows), len(cells)])
        n = padded * w
        for buf, src in ((self.input_ids, batch.input_ids), (self.positions, batch.positions),
                         (self.out_cache_loc, batch.out_cache_loc)):
            buf[:n].zero_()
            buf.index_copy_(0, rows_d, src)
        self.mask[:padded * w * w].copy_(self.diag[:padded * w * w])
        self.mask.index_put_((cells_d,), batch.spec_info.flat)
        for buf, src in ((self.req_pool_indices, batch.req_pool_indices),
                         (self.prefix_lens, batch.extend_prefix_lens)):
            buf[:bs].copy_(src, non_blocking=True)
            buf[bs:padded].zero_()
        torch.add(self.prefix_lens[:padded], w, out=self.seq_lens[:padded])
        return padded, rows_d

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """fp32 logits of every fed row, in the batch's (ragged) order."""
        padded, rows = self.load(batch)
        graph = self.graphs.get(padded)
        if graph is not None:
            graph.replay()
            self.replays += 1
            logits = self.outputs[padded]
        else:  # not captured (CPU): the computation a replay performs
            static = self.static_batch(padded)
            static.extend_prefix_lens_cpu = (list(batch.extend_prefix_lens_cpu)
                                             + [0] * (padded - batch.batch_size))
            logits = self.runner.forward_eager(static)
        return logits.index_select(0, rows)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first (smaller graphs reuse its memory)."""
        dev = self.runner.device
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), padded_layout():
            for bs in reversed(self.batch_sizes):
                batch = self.static_batch(bs)
                for _ in range(2):  # warm up: Triton compiles, cuBLAS picks kernels
                    self.runner.forward_eager(batch)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    self.outputs[bs] = self.runner.forward_eager(batch)
                self.pool = graph.pool()
                self.graphs[bs] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize(dev)
        logger.info("captured tree-verify CUDA graphs (%d rows per request) for batch sizes %s",
                    self.width, self.batch_sizes)

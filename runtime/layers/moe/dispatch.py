"""Expert-parallel dispatch and combine: each EP rank holds ``E / ep_size`` experts; the tokens
go to the ranks that own their experts over all-to-all and come back to be combined.

Attention stays tensor-parallel, so every rank of the EP group enters the MoE layer with the
same ``T`` tokens. Each EP rank takes one contiguous chunk of them (``ceil(T / ep)`` tokens;
the last ranks may have fewer, or none), routes its chunk's ``(token, expert)`` pairs and
sends each pair's hidden row to the rank owning the expert (with the expert's local index).
The owner computes the rows it got with the layer's quant method (fused Triton kernel on the
GPU, the torch path on the CPU), one expert per row; with ``tp_size > ep_size`` the owner's
MoE-TP group holds slices of the same experts and receives the same rows, so one all-reduce
there completes them. The rows go back by the reverse all-to-all, the sender sums each token's
k rows times its routing weights (fp32), and an all-gather over the EP group gives every rank
all ``T`` outputs again.

The other path, ``all_reduce`` (SGLang's ``--moe-a2a-backend none``): every rank computes
its own experts' pairs of all ``T`` tokens (the routing kernel hands it local ids, the others'
pairs marked E_local: skipped by the fused kernel, weight 0 on the torch path) and one
all-reduce over the TP group sums the experts' and the MoE-TP slices' parts. No dispatch, no
host sync, the launches of plain TP: one (custom, NVLink) all-reduce per layer. The
all-to-all path costs 3 all-to-alls and an all-gather (NCCL) plus ~30 small indexing launches
per layer; at decode sizes that latency is the whole step (2x H200, Qwen3-30B-A3B batch 1:
0.23x TP=2), and since the tokens are already on every rank it moves more bytes as well.

``ep_dispatch`` (``DispatchPolicy``): ``auto`` (default) takes the all_reduce path, except that
with ``ep_a2a_min_tokens`` set, eager batches of that many tokens (prefill) take the variable
all-to-all; ``all_to_all`` and ``all_reduce`` force one (``all_to_all``: the padded layout in
graphs). Measured on 2x H200, Qwen3-30B-A3B (RESULTS.md): batch-1 decode 0.976x TP=2 on the
all-reduce path (0.23x all-to-all); offline the all-reduce everywhere 1.037x TP=2, the
all-to-all for prefill batches >= 1024 tokens 0.861x: hence no all-to-all by default.

Two layouts of the all-to-all send buffer:
- variable (eager: CPU, GPU prefill): rows sorted by destination, the per-destination counts
  exchanged first (``collectives.exchange_counts``), then all-to-all with those split sizes.
  Exact sizes, at the price of a host sync per layer for the counts.
- padded (CUDA-graph capture and its warm-up runs: decode): each destination gets a fixed slot of ``chunk *
  k`` rows (the most one chunk can send it); unused rows are never read back (the fused kernel
  skips them: expert id E_local; the torch path computes them as expert 0 on zero rows).
  Equal splits need no host values, so the whole exchange is captured in the graph.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...distributed.collectives import all_gather, all_reduce, all_to_all, exchange_counts
from ...distributed.state import TPGroup
from ...kernels.dispatch import use_triton

MODES = ("auto", "all_to_all", "all_reduce")


@dataclass(frozen=True)
class DispatchPolicy:
    """``EngineConfig.ep_dispatch`` / ``ep_a2a_min_tokens``: which path a MoE layer's tokens
    take at ep_size > 1 (``path``); every rank sees the same T, so all ranks pick alike."""

    mode: str = "auto"
    a2a_min_tokens: int | None = None  # auto: eager batches this large take the all-to-all

    def path(self, x: torch.Tensor) -> str:
        """``all_reduce``, ``padded`` (equal-split all-to-all) or ``variable`` (exact splits).
        auto: all_reduce, except eager batches of ``a2a_min_tokens`` tokens or more (never
        inside CUDA graphs; None: never), which take the variable all-to-all."""
        padded = use_padded_layout(x)
        if self.mode == "auto":
            big = self.a2a_min_tokens is not None and x.shape[0] >= self.a2a_min_tokens
            return "variable" if big and not padded else "all_reduce"
        if self.mode == "all_reduce":
            return "all_reduce"
        return "padded" if padded else "variable"


# set from EngineConfig by the model runner before it builds the model (read by FusedMoE)
_POLICY = [DispatchPolicy()]


def set_ep_dispatch(mode: str, a2a_min_tokens: int | None = None) -> None:
    if mode not in MODES:
        raise ValueError(f"ep_dispatch={mode!r}: expected one of {', '.join(MODES)}")
    _POLICY[0] = DispatchPolicy(mode, a2a_min_tokens)


def ep_dispatch() -> DispatchPolicy:
    return _POLICY[0]


_PADDED = [False]


@contextlib.contextmanager
def padded_layout() -> Iterator[None]:
    """All-to-alls use the padded layout inside (``CudaGraphRunner.capture`` wraps its warm-up
    runs and captures: the warm-up then compiles and caches what the capture will use)."""
    _PADDED[0] = True
    try:
        yield
    finally:
        _PADDED[0] = False


def use_padded_layout(x: torch.Tensor) -> bool:
    return _PADDED[0] or (x.is_cuda and torch.cuda.is_current_stream_capturing())


@dataclass(frozen=True)
class SendPlan:
    """Where this rank's pairs go: ``pos[pair]``, the pair's row in the send buffer;
    ``rows``, the buffer's size; split sizes per rank (None: equal, the padded layout)."""

    pos: torch.Tensor  # [pairs] int64
    rows: int
    send_splits: list[int] | None
    recv_splits: list[int] | None


def plan_sends(dest: torch.Tensor, group: TPGroup, slot: int | None) -> SendPlan:
    """``dest [pairs]`` (owning EP rank of each pair) -> its send layout; ``slot``: the padded
    layout's rows per destination, None: the variable one (exchanges the counts)."""
    size = group.size
    counts = torch.zeros(size, dtype=torch.int64, device=dest.device)
    counts.scatter_add_(0, dest, torch.ones_like(dest))
    order = torch.sort(dest, stable=True)[1]
    start = torch.cumsum(counts, 0) - counts
    rank_in_dest = torch.empty_like(order)
    rank_in_dest[order] = torch.arange(dest.numel(), device=dest.device) - start[dest[order]]
    if slot is not None:
        return SendPlan(dest * slot + rank_in_dest, slot * size, None, None)
    recv = exchange_counts(counts, group)
    send_splits, recv_splits = counts.tolist(), recv.tolist()  # NOTE: the host sync
    return SendPlan(start[dest] + rank_in_dest, dest.numel(), send_splits, recv_splits)


def expert_parallel_moe(layer, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                        ep: TPGroup, moe_tp: TPGroup, padded: bool) -> torch.Tensor:
    """``x [T, H]`` (the same on every rank), routing ``[T, k]`` over all ``E`` experts ->
    ``[T, H]``: this layer's output, complete on every rank."""
    tokens, hidden = x.shape
    top_k = ids.shape[1]
    chunk = -(-tokens // ep.size)
    lo, hi = min(ep.rank * chunk, tokens), min((ep.rank + 1) * chunk, tokens)
    # NOTE: the clamp keeps a NaN row's id (a CUDA graph's padding rows may hold garbage; the
    # routing kernel then returns E) inside the send buffer; its output is never used
    my_ids = ids[lo:hi].reshape(-1).long().clamp_(max=layer.num_experts - 1)
    dest = my_ids // layer.num_local_experts
    plan = plan_sends(dest, ep, chunk * top_k if padded else None)
    pair_token = torch.arange(my_ids.numel(), device=x.device) // top_k
    send_x = x.new_zeros(plan.rows, hidden)
    send_x[plan.pos] = x[lo:hi][pair_token]
    pad_id = layer.num_local_experts if use_triton(x) else 0  # see the module docstring
    send_e = torch.full((plan.rows,), pad_id, dtype=torch.int32, device=x.device)
    send_e[plan.pos] = (my_ids % layer.num_local_experts).to(torch.int32)
    recv_x = all_to_all(send_x, plan.send_splits, plan.recv_splits, ep)
    recv_e = all_to_all(send_e, plan.send_splits, plan.recv_splits, ep)
    # one expert per received row, weight 1: the routing weights are applied by the sender
    ones = torch.ones(recv_e.shape[0], 1, dtype=torch.float32, device=x.device)
    y = layer.quant_method.apply(layer, recv_x, ones, recv_e.unsqueeze(1), sum_experts=True)
    y = all_reduce(y, moe_tp)  # the MoE-TP ranks computed slices of the same experts
    back = all_to_all(y, plan.recv_splits, plan.send_splits, ep)
    pairs = back[plan.pos].view(hi - lo, top_k, hidden).float()
    out = (pairs * weights[lo:hi].float().unsqueeze(-1)).sum(1).to(x.dtype)
    if chunk != hi - lo:  # every rank gathers chunk rows: pad the short chunks
        out = torch.cat([out, out.new_zeros(chunk - (hi - lo), hidden)])
    return all_gather(out, dim=0, group=ep)[:tokens]


def local_experts_moe(layer, x: torch.Tensor, weights: torch.Tensor,
                      local_ids: torch.Tensor) -> torch.Tensor:
    """``all_reduce`` path: this rank's experts' part of every token's output, summed over the
    TP group (``[T, H]``, complete on every rank). ``local_ids``: routing ids local to this
    rank, ``num_local_experts`` for another rank's expert (``select_experts(local=)``)."""
    if use_triton(x):  # the fused kernel skips expert id E_local (no weight reads)
        out = layer.quant_method.apply(layer, x, weights, local_ids, sum_experts=True)
    else:  # the torch path: weight 0 on expert 0 (wasted work, CPU only)
        mine = local_ids < layer.num_local_experts
        out = layer.quant_method.apply(layer, x, torch.where(mine, weights, 0.0),
                                       torch.where(mine, local_ids, 0), sum_experts=True)
    return all_reduce(out)

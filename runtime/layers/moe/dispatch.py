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

Two layouts of the send buffer:
- variable (eager: CPU, GPU prefill): rows sorted by destination, the per-destination counts
  exchanged first (``collectives.exchange_counts``), then all-to-all with those split sizes.
  Exact sizes, at the price of a host sync per layer for the counts.
- padded (during CUDA-graph capture: decode): each destination gets a fixed slot of ``chunk *
  k`` rows (the most one chunk can send it), unused rows are zero and computed as expert 0 and
  dropped. Equal splits need no host values, so the whole exchange is captured in the graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...distributed.collectives import all_gather, all_reduce, all_to_all, exchange_counts
from ...distributed.state import TPGroup


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
    my_ids = ids[lo:hi].reshape(-1).long()
    dest = my_ids // layer.num_local_experts
    plan = plan_sends(dest, ep, chunk * top_k if padded else None)
    pair_token = torch.arange(my_ids.numel(), device=x.device) // top_k
    send_x = x.new_zeros(plan.rows, hidden)
    send_x[plan.pos] = x[lo:hi][pair_token]
    send_e = torch.zeros(plan.rows, dtype=torch.int32, device=x.device)
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

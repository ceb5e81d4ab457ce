"""One rank of the expert-parallel tests (spawned by test_ep_models.py). For each layout
(tp_size, ep_size) it joins a fresh gloo group (ranks beyond tp_size sit that one out), builds
a ModelRunner per model directory, decodes greedily (also with the padded all-to-all layout
of CUDA graphs) and reports the tokens and rank 0's logits;
then checks one FusedMoE layer's padded dispatch (the CUDA-graph layout) and variable dispatch
against the single-process product."""
from __future__ import annotations

import contextlib

import torch

from .tp_worker import model_test_module

DECODE_STEPS = 6


def runner_config(model_dir: str, device: str, **parallel):
    """The EngineConfig of every runner in these tests (fp32 on GPU too: the MoE GEMMs run tf32
    there, the tiny models' margins keep greedy tokens apart)."""
    from sgdsl.runtime.config import EngineConfig

    # ep_a2a_min_tokens=8: ep_dispatch=auto prefills these prompts (22 tokens) over the
    # variable all-to-all and decodes them (3 tokens; graphs: always) over the all-reduce (the
    # default, None, takes the all-reduce everywhere: the all_reduce layout's path)
    return EngineConfig(model=model_dir, device=device, dtype="float32", max_total_tokens=256,
                        max_running_requests=4, cuda_graph_max_bs=4, ep_a2a_min_tokens=8,
                        **parallel)


def greedy(runner, prompts: list[list[int]]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens of every prompt (an extend, then decode steps) and each step's logits."""
    d = model_test_module("driver").RunnerDriver(runner)
    reqs = [d.new_request() for _ in prompts]
    logits = [d.extend(list(zip(reqs, prompts)))]
    tokens = [logits[-1].argmax(-1).tolist()]
    for _ in range(DECODE_STEPS):
        logits.append(d.decode(list(zip(reqs, tokens[-1]))))
        tokens.append(logits[-1].argmax(-1).tolist())
    return [list(t) for t in zip(*tokens)], [t.float().cpu().clone() for t in logits]


def moe_layer_check(device: torch.device, seed: int = 0) -> dict[str, float]:
    """Max |difference| of the padded and the variable dispatch (and of the all_reduce mode)
    from the plain torch product
    of the whole layer (every expert), on this rank's group (9 tokens: uneven chunks), relative
    to the largest output (on GPU the fused kernel, and the padding rows it skips)."""
    from sgdsl.runtime.layers.moe.dispatch import (expert_parallel_moe, local_experts_moe,
                                                   padded_layout)
    from sgdsl.runtime.layers.moe.layer import FusedMoE
    from sgdsl.runtime.layers.moe.reference import moe_reference
    from sgdsl.runtime.layers.moe.router import select_experts
    from sgdsl.runtime.distributed.state import get_ep_group, get_moe_tp_group

    experts, hidden, inter = 8, 16, 24
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.3).to(device)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * 0.3).to(device)
    x = torch.randn(9, hidden, generator=gen).to(device)
    logits = torch.randn(9, experts, generator=gen).to(device)
    layer = FusedMoE(experts, 3, hidden, inter, renormalize=True, dtype=torch.float32,
                     device=device)
    layer.w13_weight.weight_loader(layer.w13_weight, w13)
    layer.w2_weight.weight_loader(layer.w2_weight, w2)
    weights, ids = select_experts(logits, 3, True)
    want = moe_reference(x, lambda e: (w13[e], w2[e]), weights, ids)
    out = {}
    for name, padded in (("variable", False), ("padded", True)):
        got = expert_parallel_moe(layer, x, weights, ids, get_ep_group(), get_moe_tp_group(),
                                  padded)
        out[name] = float((got - want).abs().max() / want.abs().max())
    local = select_experts(logits, 3, True, (layer.first_expert, layer.num_local_experts))
    got = local_experts_moe(layer, x, *local)
    out["all_reduce"] = float((got - want).abs().max() / want.abs().max())
    # the layer's own choice under the runner's policy, eager (auto: 9 >= 8 tokens, the
    # variable all-to-all) and as CUDA graphs run it (auto: the all-reduce)
    for name, ctx in (("forward", contextlib.nullcontext()), ("forward_graph", padded_layout())):
        with ctx:
            got = layer(x, logits)
        out[name] = float((got - want).abs().max() / want.abs().max())
    return out


def run_rank(rank: int, layouts: list[tuple[int, int, str, str]], dirs: list[str],
             prompts: list[list[int]], results, device: str = "cpu") -> None:
    """``layouts``: (tp_size, ep_size, ep_dispatch, init_method) to run one after the other;
    ``device``: cpu (gloo) or cuda (rank r on GPU r, NCCL, CUDA graphs)."""
    from sgdsl.runtime.distributed.collectives import barrier
    from sgdsl.runtime.distributed.state import destroy_tp_group, init_tp_group
    from sgdsl.runtime.layers.moe.dispatch import padded_layout
    from sgdsl.runtime.model.runner import ModelRunner

    torch.set_num_threads(1)
    for size, ep, mode, method in layouts:
        if rank >= size:
            continue
        dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
        init_tp_group(rank, size, dev, method, timeout_s=120, ep_size=ep)
        try:
            for model_dir in dirs:
                runner = ModelRunner(runner_config(model_dir, device, tp_size=size, ep_size=ep,
                                                   ep_dispatch=mode))
                tokens, logits = greedy(runner, prompts)
                with padded_layout():  # what CUDA graphs run (equal splits)
                    padded = greedy(runner, prompts)[0]
                local = runner.model.model.layers[0].mlp.experts.w13_weight.shape[0]
                results.put(("model", size, ep, mode, rank, model_dir, local, tokens, padded,
                             [t.numpy() for t in logits] if rank == 0 else None))
            results.put(("layer", size, ep, mode, rank, moe_layer_check(dev)))
            barrier(timeout_s=120)  # leave together (see tp_worker.run_rank)
        finally:
            destroy_tp_group()

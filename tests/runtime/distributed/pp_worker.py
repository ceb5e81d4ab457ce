"""One rank of the pipeline-parallel model tests (spawned by test_pp_models.py). For each layout
(pp_size, tp_size, ep_size) it joins a fresh gloo (or NCCL) group of pp_size x tp_size ranks
(ranks beyond that sit the layout out), builds a ModelRunner per model directory, decodes
greedily through the test driver and reports its tokens, its stage's KV layer count, and rank
0's logits (rank 0 is on the last stage, where the logits are)."""
from __future__ import annotations

import torch

from .ep_worker import DECODE_STEPS, runner_config
from .tp_worker import model_test_module


def greedy(runner, prompts: list[list[int]]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """``ep_worker.greedy`` as the scheduler does it under PP: rank 0 (the last stage) picks
    the tokens and every rank takes them (the other stages have no logits)."""
    from sgdsl.runtime.distributed.collectives import broadcast

    d = model_test_module("driver").RunnerDriver(runner)
    reqs = [d.new_request() for _ in prompts]
    logits = [d.extend(list(zip(reqs, prompts)))]
    pick = lambda x: broadcast(x.argmax(-1).to(torch.int64), src=0).tolist()  # noqa: E731
    tokens = [pick(logits[-1])]
    for _ in range(DECODE_STEPS):
        logits.append(d.decode(list(zip(reqs, tokens[-1]))))
        tokens.append(pick(logits[-1]))
    return [list(t) for t in zip(*tokens)], [t.float().cpu().clone() for t in logits]


def run_rank(rank: int, layouts: list[tuple[int, int, int, str]], dirs: list[str],
             prompts: list[list[int]], results, device: str = "cpu") -> None:
    """``layouts``: (pp_size, tp_size, ep_size, init_method), run one after the other; ep_size
    > 1 runs only the MoE directory (the last one), ep_size 1 the others."""
    from sgdsl.runtime.distributed.collectives import barrier
    from sgdsl.runtime.distributed.state import destroy_tp_group, init_tp_group, pp_place
    from sgdsl.runtime.model.runner import ModelRunner

    torch.set_num_threads(1)
    for pp, tp, ep, method in layouts:
        if rank >= pp * tp:
            continue
        dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
        init_tp_group(rank, pp * tp, dev, method, timeout_s=120, ep_size=ep, pp_size=pp)
        try:
            for model_dir in dirs[:-1] if ep == 1 else dirs[-1:]:
                runner = ModelRunner(runner_config(model_dir, device, tp_size=tp, pp_size=pp,
                                                   ep_size=ep))
                tokens, logits = greedy(runner, prompts)
                kv_layers = len(runner.token_kv_pool.k_buffer)
                results.put((pp, tp, ep, rank, model_dir, pp_place()[0], kv_layers, tokens,
                             [t.numpy() for t in logits] if rank == 0 else None))
            barrier(timeout_s=120)  # leave together (see tp_worker.run_rank)
        finally:
            destroy_tp_group()

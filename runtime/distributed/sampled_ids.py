"""The sampled ids of a step, the same on every rank without a collective (``agree``).

Under tensor parallelism every rank samples from the same logits: the LM head's vocab blocks
are all-gathered (``layers/vocab_parallel.py``), so each rank holds the same bytes, and the
sampler is a deterministic function of those bytes and of state every rank keeps identically
(the batch generator seeded with the engine's seed and advanced by the same draws, per-request
generators seeded from (seed, step), penalty counts and grammar masks built from the same
tokens). So every rank already holds rank 0's ids; the broadcast that used to overwrite them
cost a collective launch per decode step outside the CUDA graph (~10-20 us at TP=4 on H200s,
on the critical path between two graph replays).

pp: a stage other than the last has no logits; the last stage (rank 0) still broadcasts its
ids to the world. ``$SGDSL_TP_IDS`` picks: ``local`` (default), ``broadcast`` (the old rank-0
broadcast everywhere, a safety switch) or ``check`` (all-gather the ids and raise where ranks
differ: tests and debugging; it syncs the host every step).
"""
from __future__ import annotations

import os

import torch

from .collectives import all_gather, broadcast
from .state import get_tp_group, pp_place

MODES = ("local", "broadcast", "check")


def ids_mode() -> str:
    mode = os.environ.get("SGDSL_TP_IDS", "local") or "local"
    if mode not in MODES:
        raise ValueError(f"SGDSL_TP_IDS={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def needs_broadcast() -> bool:
    """Whether ``agree`` broadcasts (pp, or the safety switch): the ids must then come from
    the sampler on every rank, never from a shortcut that skips it."""
    return pp_place()[1] > 1 or ids_mode() == "broadcast"


def agree(ids: torch.Tensor) -> torch.Tensor:
    """``ids`` as every rank holds them: rank 0's (see the module docstring)."""
    if needs_broadcast():
        return broadcast(ids, src=0)
    if ids_mode() == "check" and get_tp_group().size > 1:
        gathered = all_gather(ids.reshape(1, -1), dim=0).tolist()
        problem = disagreement(gathered)
        if problem is not None:
            raise RuntimeError(problem)
    return ids


def disagreement(per_rank: list[list[int]]) -> str | None:
    """A message naming the first rank whose ids differ from rank 0's, None if all agree."""
    for rank, ids in enumerate(per_rank[1:], start=1):
        if ids != per_rank[0]:
            rows = [i for i, (a, b) in enumerate(zip(per_rank[0], ids)) if a != b]
            return (f"TP rank {rank} sampled {ids} where rank 0 sampled {per_rank[0]} (rows "
                    f"{rows}): the ranks' logits or sampling state differ")
    return None

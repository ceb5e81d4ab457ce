"""Sampling a verify forward's rows: one sample per fed row, on the device, with the request's
own sampling state at that node (accept.py's exact rejection sampling relies on it)."""
from __future__ import annotations

from typing import Any

import torch

from ..distributed.collectives import broadcast
from ..grammar.base import allocate_bitmask
from ..layers.sampler import SamplingBatchInfo, apply_vocab_mask, greedy_argmax
from ..layers.upload import to_device
from .base import DraftTree


def sample_verify(sched: Any, reqs: list[Any], trees: list[DraftTree], logits: torch.Tensor,
                  masks: list[Any]) -> torch.Tensor:
    """One sample per fed row (on the device, not read) with the request's own sampling
    state at that node: its output step (seeds), the draft path as output so far (penalties,
    min_new_tokens) and the grammar mask of the state there (``masks``: per request, its
    rows or None)."""
    mask = _mask(sched, trees, masks)
    if mask is not None:
        mask = to_device(mask, logits.device)
    info = sched.running.info
    if info.all_greedy and info.penalties.is_empty:
        # NOTE: greedy rows need no per-row sampling state: the (masked) argmax, as the
        # sampler's all-greedy path, without building and uploading a verify-row info
        if mask is not None:
            logits = apply_vocab_mask(logits, mask)
        return broadcast(greedy_argmax(logits), src=0)
    params, outputs, prompts = [], [], []
    for req, tree in zip(reqs, trees):
        penal = req.sampling_params.has_penalties
        for node in [-1, *range(len(tree))]:
            path = [tree.tokens[j] for j in tree.path(node)] if node >= 0 else []
            params.append(req.sampling_params)
            prompts.append(req.origin_input_ids)
            # NOTE: without penalties only the length counts (the seeded step number)
            n = len(req.output_ids) + len(path)
            outputs.append(req.output_ids + path if penal else range(n))
    info = SamplingBatchInfo.from_params(params, logits.shape[-1], logits.device,
                                         sched.sampler.eos, prompts, outputs)
    return sched.sampler.sample_ids(logits, info, mask)


def _mask(sched: Any, trees: list[DraftTree], masks: list[Any]) -> torch.Tensor | None:
    if all(m is None for m in masks):
        return None
    bitmask = allocate_bitmask(len(trees) + sum(map(len, trees)), sched.grammar.vocab_size)
    at = 0
    for tree, rows in zip(trees, masks):
        if rows is not None:
            bitmask[at:at + rows.shape[0]] = rows
        at += len(tree) + 1
    return bitmask

"""The accepting half of a speculative step (decoder.py ``SpecDecoder._verify`` calls it once
the verify's samples are read): per request, the accepted path (accept.py ``walk``), its KV kept
and the rest freed, the emitted tokens appended through the finish checks (append.py), logprobs
and acceptance recorded; then the running batch follows the appends, the grammar takes its step
on the last tokens, leavers leave, and the outputs are sent, or held for the step's read when
every request decodes on (``SpecDecoder._outputs``: they go out during the next verify)."""
from __future__ import annotations

from typing import Any

import torch

from .accept import commit_kv, record_logprobs, row_of_emitted, walk
from .append import append_emitted, truncate_to_ids
from .base import DraftTree
from .verify_batch import VerifyLayout


def accept_step(decoder: Any, sched: Any, reqs: list[Any], trees: list[DraftTree],
                layout: VerifyLayout, logits: torch.Tensor, ids: list[int],
                ends: list[bool]) -> None:
    stats = decoder.stats
    settled: set[int] = set()  # requests whose grammar step was taken while appending
    for i, (req, tree) in enumerate(zip(reqs, trees)):
        first, at = layout.first[i], layout.compact[i]
        path, emitted = walk(tree, ids[at:at + len(tree) + 1])
        commit_kv(sched.memory, req, layout.kv_lens[i], len(tree), path,
                  layout.slots[first:first + len(tree) + 1])
        if ends[i] and len(path) == len(tree):  # the grammar's step follows the last
            emitted.pop()  # draft token, not a sample; that token is the newest, so
            sched.memory.truncate(req, req.kv_len - 1)  # its KV is the next step's
            stats.step_ends += 1
        n, forced = append_emitted(sched, req, emitted)
        if forced:  # a forced completion after a draft token: it finished (append.py)
            stats.forced_between += 1
            settled.add(id(req))
            truncate_to_ids(sched.memory, req, layout.kv_lens[i], emitted[:len(path)])
        if req.return_logprob:
            record_logprobs(req, logits, row_of_emitted(first, path)[:n], emitted[:n])
        accepted = min(len(path), n)
        req.spec_verify_ct += 1
        req.spec_accepted_tokens += accepted
        stats.observe(len(tree), accepted, n)
        if len(tree):
            decoder._observe(req, accepted)
    sync_running(sched, reqs, logits.shape[-1])
    after_tokens(decoder, sched, reqs, settled)


def sync_running(sched: Any, reqs: list[Any], vocab: int) -> None:
    """The running batch's positions, last tokens and sampling rows follow the appends."""
    running = sched.running
    for req in reqs:  # jump-forward tokens fed: a plain row again
        req.pending_forced = False
    running.after_verify(reqs)  # spec: running.py
    info = running.info
    if info.penalties.is_empty:
        info.steps = [len(r.output_ids) for r in reqs]
    else:  # penalty counts over the new tokens: rebuilt from the outputs
        running.info = sched.sampler.new_info(reqs, vocab)


def after_tokens(decoder: Any, sched: Any, reqs: list[Any], settled: set[int]) -> None:
    """As a decode step's read: grammar steps on the last tokens (jump-forward, forced
    completion, termination) but for the requests ``settled`` already, leavers out, outputs
    sent (or held for the step's read: ``SpecDecoder._outputs``)."""
    constrained = [r for r in reqs if r.grammar is not None and id(r) not in settled]
    if constrained:
        for req in sched.grammar.after_sample(constrained, sched.checker, len(reqs)):
            sched._jumped(req)
    sched._leave_batch(reqs)
    sched._requeue_jumped(reqs)
    if sched.overlap and not any(r.finished or r.jumped for r in reqs):
        decoder.held = reqs  # every request decodes on: sent at the step's read
        decoder.stats.held_outputs += 1
    else:  # one leaves: its KV goes back now
        sched._finish_and_send(reqs)

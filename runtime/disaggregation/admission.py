"""A prefill server's admission beside a chunked prompt: short prompts first.

A colocated server continues a long prompt's chunks with the whole token budget of each
prefill batch, so that the prompt's KV (and its first token) is ready as soon as possible
while decodes wait the least number of steps. A prefill server has no decodes to protect and
its clients wait for their first token only; a chat turn arriving while an 8k-token prompt
runs in 2k-token chunks would wait for all of them. So there, waiting prompts that fit whole
in ``SHORT_SHARE`` of the budget go first, and the chunked prompt continues in the same batch
with the rest of the budget: a short prompt waits at most one chunk, a long one advances at
least ``1 - SHORT_SHARE`` of a chunk per batch.
"""
from __future__ import annotations

from typing import Any, Iterable

from ..scheduler.req import Req

SHORT_SHARE = 0.5


def short_first(adder: Any, waiting: Iterable[Req]) -> list[Req]:
    """Admit (``adder``: the batch's PrefillAdder, before the chunked prompt continues) the
    waiting requests that fit whole in ``SHORT_SHARE`` of its budget; the ones admitted."""
    full = adder.budget
    share = int(full * SHORT_SHARE)
    adder.budget = share
    taken: list[Req] = []
    try:
        for req in waiting:
            if adder.budget <= 0:
                break
            if req.seq_len > adder.budget:  # would be chunked: it waits for its turn
                continue
            before = len(adder.reqs)
            if not adder.add(req):
                break
            if len(adder.reqs) > before:  # (not deferred for in-batch prefix sharing)
                taken.append(req)
    finally:
        adder.budget = full - (share - adder.budget)
    return taken

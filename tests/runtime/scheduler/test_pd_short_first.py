"""A prefill server's admission beside a chunked prompt (disaggregation/admission.py): short
prompts that fit whole in half the budget run in the next batch, the chunked prompt continues
beside them with the rest; the outputs (KV bookkeeping) stay those of the reference."""
from __future__ import annotations

import pytest

from sgdsl.runtime.disaggregation.admission import short_first

from .standin import expected


class _PrefillPolicy:
    """The scheduler's disaggregation hooks of a prefill server, minus the transfers."""

    busy = False

    def poll(self) -> None:
        pass

    def prefilled(self, reqs) -> None:
        pass

    def holds(self, req) -> bool:
        return False

    def remove(self, rid, message):
        return None

    def check_idle(self) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def short_first(self, adder, waiting):
        return short_first(adder, waiting)


def _extends(h) -> list[list[int]]:
    return [list(b.extend_seq_lens_cpu) for b in h.runner.forwards if not b.mode.is_decode]


@pytest.mark.parametrize("overlap", [False, True])
def test_short_prompts_run_beside_the_chunked_one(make_harness, overlap):
    h = make_harness(chunked_prefill_size=16, disable_overlap_schedule=not overlap)
    h.sched.pd = _PrefillPolicy()
    long = [(i * 5) % 40 + 1 for i in range(40)]
    shorts = {"a": [3, 4, 5, 6, 7], "b": [9, 8, 7], "c": [2] * 12}
    h.submit("long", long, max_new_tokens=3, ignore_eos=True)
    h.sched.step()  # the first chunk
    for rid, ids in shorts.items():
        h.submit(rid, ids, max_new_tokens=3, ignore_eos=True)
    h.run()
    assert h.outs["long"] == expected(long, 3)
    for rid, ids in shorts.items():
        assert h.outs[rid] == expected(ids, 3)
    # a and b (8 tokens) fit half the budget and go first, the chunk gets the other 8; c (12
    # tokens) is not short (more than half the budget): it waits for the chunked prompt's end,
    # as it would on a colocated server
    assert _extends(h) == [[16], [5, 3, 8], [16], [12]]


def test_without_waiting_prompts_the_chunk_keeps_the_whole_budget(make_harness):
    h = make_harness(chunked_prefill_size=16)
    h.sched.pd = _PrefillPolicy()
    long = [(i * 3) % 40 + 1 for i in range(40)]
    h.submit("long", long, max_new_tokens=2, ignore_eos=True)
    h.run()
    assert h.outs["long"] == expected(long, 2)
    assert _extends(h) == [[16], [16], [8]]

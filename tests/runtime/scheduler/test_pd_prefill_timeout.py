"""A prefill server whose decode server never asks for the KV (it died before registering the
request, or the router went away): the real ``PrefillSide`` over the stand-in model gives up
after ``disaggregation_timeout_s``, fails the request with a reason and frees its KV, so the
idle invariant holds (issue 27: "never hangs", "no leak on the prefill side")."""
from __future__ import annotations

import time

from sgdsl.runtime.disaggregation.bootstrap import Bootstrap
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams
from processes import free_port

TIMEOUT_S = 0.5


def test_unclaimed_kv_times_out_with_a_reason_and_is_freed(make_harness):
    port = free_port()
    h = make_harness(disaggregation_mode="prefill", disaggregation_bootstrap_port=port,
                     disaggregation_transfer_backend="gloo", disaggregation_timeout_s=TIMEOUT_S)
    boot = Bootstrap("127.0.0.1", port, "7.0")
    h.sched.handle(m.TokenizedGenerateReq("orphan", list(range(1, 30)),
                                          SamplingParams(max_new_tokens=8, temperature=0.0),
                                          bootstrap=boot))
    deadline, held = time.monotonic() + 60, 0  # generous: the timeout is half a second
    while "orphan" not in h.finish and time.monotonic() < deadline:
        h.sched.step()
        held = max(held, h.sched.stats()["pd_held_reqs"])
    assert held == 1  # prefilled, its KV waited for the decode side
    reason = h.finish.get("orphan")
    assert reason is not None, "the prefill server held the KV past its timeout"
    assert reason["type"] == "abort" and "no decode server asked" in reason["message"]
    assert len(h.outs["orphan"]) == 1  # the first token, sampled here
    stats = h.sched.stats()
    assert stats["pd_transfer_failures"] == 1 and stats["pd_held_reqs"] == 0
    h.run()
    h.check_idle()  # nothing held, every slot back in the pool or the radix cache

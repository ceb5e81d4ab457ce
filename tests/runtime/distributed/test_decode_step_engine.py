"""tp-step at TP=1 on the CPU: decode steps run whole through the step graphs' path, eagerly
(``$SGDSL_DECODE_STEP=eager``; model/step_graphs.py), and the engine gives the plain path's
answers to the mixed workload (greedy tokens, chunked prefill, retraction, cache hits with
logprobs, grammar, seeded sampling); the TP=2 engine of test_tp_engine.py runs the same path."""
from __future__ import annotations

import pytest

from sgdsl.runtime import Engine

from .mixed_workload import TINY, assert_same, run_mixed


@pytest.fixture(scope="module")
def stepped(tiny_model_dir):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SGDSL_DECODE_STEP", "eager")
        engine = Engine(str(tiny_model_dir), **TINY)
    yield engine
    engine.shutdown()


def test_whole_steps_at_tp1_equal_the_plain_path(stepped, tiny_ref):
    assert_same(run_mixed(stepped), tiny_ref)
    stats = stepped.stats()
    assert stats["whole_decode_steps"] > 20 and stats["graph_ids_steps"] > 10, stats
    # sampling rows take the logits (the step's greedy ids are overwritten): both kinds run
    assert stats["graph_ids_steps"] < stats["whole_decode_steps"]
    assert stats["local_greedy_steps"] == 0  # one rank: its logits are all the logits

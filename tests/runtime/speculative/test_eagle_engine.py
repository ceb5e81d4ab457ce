"""EAGLE end to end on the tiny random Llama (``tiny_engine``'s model and weights): greedy
outputs with speculation equal the non-speculative engine's, token for token (random heads
are rarely accepted: the verifier must keep the target's tokens whatever the tree). EAGLE3
runs the same path with its own head (test_eagle.py drafts with both)."""
from __future__ import annotations

import pytest

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(100, 140)), [7, 7, 7]]
PARAMS = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


@pytest.fixture(scope="module", params=["EAGLE"])
def eagle_engine(request, tiny_model_dir, tmp_path_factory):
    import json

    from sgdsl.runtime import Engine

    from .eagle_heads import write_head

    base = json.loads((tiny_model_dir / "config.json").read_text())
    head = write_head(tmp_path_factory.mktemp("head"), base, request.param == "EAGLE3")
    # NOTE: as tiny_engine (same dummy target weights); the head is dummy too (load_format);
    # no grammar backend (none is sent here: its worker processes cost seconds of CPU)
    engine = Engine(str(tiny_model_dir), load_format="dummy", max_total_tokens=4096,
                    max_running_requests=32, num_threads=1, grammar_backend="none",
                    speculative_algorithm=request.param,
                    speculative_draft_model_path=str(head), speculative_num_steps=3,
                    speculative_eagle_topk=2, speculative_num_draft_tokens=4,
                    speculative_min_speedup=0)  # the cost gate off: steps are counted
    yield engine
    engine.shutdown()


def test_greedy_equals_non_speculative(eagle_engine, engine):
    ref = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)]
    out = eagle_engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)
    assert [o["output_ids"] for o in out] == ref
    assert all(o["meta_info"]["spec_verify_ct"] >= 1 for o in out)
    assert eagle_engine.stats()["spec_draft_tokens"] > 0  # trees were proposed and verified
    eagle_engine.check_idle_integrity()

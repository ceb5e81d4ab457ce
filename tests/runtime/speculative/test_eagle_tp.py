"""EAGLE3 at tensor parallelism 2 on CPU (gloo, two rank processes): the head's layer is sharded
like the target's (q/k/v and MLP split over the ranks, each keeping its kv head), every rank
drafts the same trees from the same all-reduced states, and greedy outputs equal the
non-speculative engine's token for token (the tiny random Llama at TP 2 equals TP 1:
tests/runtime/distributed/test_tp_engine.py). Trees (topk 2) verify as tree-masked extends."""
from __future__ import annotations

import json

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], list(range(100, 140)), [7, 7, 7]]
PARAMS = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def test_eagle3_tp2_equals_non_speculative(tiny_model_dir, tmp_path, engine):
    from sgdsl.runtime import Engine

    from .eagle_heads import write_head

    base = json.loads((tiny_model_dir / "config.json").read_text())
    head = write_head(tmp_path / "head", base, eagle3=True)
    ref = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)]
    # NOTE: dummy target weights as ``engine`` (drawn whole and sliced per rank: the same model);
    # no grammar is sent: no grammar helper processes on either rank
    with Engine(str(tiny_model_dir), load_format="dummy", max_total_tokens=2048,
                max_running_requests=8, num_threads=1, tp_size=2, grammar_backend="none",
                speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                speculative_num_steps=3, speculative_eagle_topk=2,
                speculative_num_draft_tokens=4) as spec:  # the cost gate on: rank 0 decides
        out = spec.generate(input_ids=PROMPTS, sampling_params=PARAMS)
        stats = spec.stats()
        spec.check_idle_integrity()  # every rank's pools, the head's KV included
    assert [o["output_ids"] for o in out] == ref
    # (the gate speculates until it has measured both kinds of step: tree steps come first)
    assert stats["spec_tree_steps"] > 0 and stats["spec_draft_tokens"] > 0

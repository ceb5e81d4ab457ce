"""The pipelined speculative step (pipeline.py: the next verify launched before this one is
read) at tensor parallelism 2 on CPU (gloo, two rank processes), forced on with
``SGDSL_SPEC_PIPELINE=1`` (the CPU default is off): every rank builds, launches, takes or wastes
the same batches ahead (their sampled ids broadcast in the same order), and NGRAM's greedy
outputs equal the non-speculative engine's token for token; every rank's pools are idle after."""
from __future__ import annotations

PROMPTS = [[5, 6, 7, 8] * 6, list(range(100, 130)) * 2, [7, 7, 7, 9, 7, 7, 7]]
PARAMS = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}


def test_pipelined_ngram_tp2_equals_non_speculative(tiny_model_dir, engine, monkeypatch):
    from sgdsl.runtime import Engine

    monkeypatch.setenv("SGDSL_SPEC_PIPELINE", "1")  # the rank processes inherit it
    ref = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=PARAMS)]
    with Engine(str(tiny_model_dir), load_format="dummy", max_total_tokens=2048,
                max_running_requests=8, num_threads=1, tp_size=2, grammar_backend="none",
                speculative_algorithm="NGRAM", speculative_min_speedup=0,
                speculative_min_accept_per_step=0) as spec:
        out = spec.generate(input_ids=PROMPTS, sampling_params=PARAMS)
        alone = spec.generate(input_ids=PROMPTS[0], sampling_params=PARAMS)  # batch 1
        stats = spec.stats()
        spec.check_idle_integrity()
    assert [o["output_ids"] for o in out] == ref
    assert alone["output_ids"] == ref[0]
    assert stats["spec_pipelined_steps"] > 0

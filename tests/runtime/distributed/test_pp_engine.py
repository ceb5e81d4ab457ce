"""Acceptance of pipeline parallelism on CPU (gloo): PP engines give the TP=1 greedy outputs
token for token and logprobs within 1e-4; every rank of every stage passes the idle invariant.

The tiny model (2 layers, tied embeddings: both stages hold the embedding) runs at PP=2 x TP=2
(4 processes) over the TP acceptance workload (a mixed batch, chunked prefill with a 16-token
budget, a KV pool small enough to force retraction, cache hits on the second pass, grammar and
seeded sampling) with every batch of two or more requests split into micro-batches (extend
and decode steps alike); the embedded SmolLM2 (30 layers) at PP=2 x TP=1 with whole batches
(the default threshold) over a lighter workload (greedy with logprobs). (Model-level cases:
uneven and 4-stage splits, MoE with EP inside the stages: test_pp_models.py.)
"""
from __future__ import annotations

import pytest

from sgdsl.runtime import Engine

from .mixed_workload import GREEDY, NO_GRAMMAR, PROMPTS, TINY, assert_same, run_mixed


def test_tiny_pp2_tp2_micro_batched_equals_tp1(tiny_model_dir, tiny_ref):
    """Every batch of two or more requests runs as two micro-batches in flight."""
    with Engine(str(tiny_model_dir), pp_size=2, tp_size=2, pp_micro_batch_tokens=1,
                **TINY) as engine:
        assert_same(run_mixed(engine), tiny_ref)
        assert len(engine._tm.procs) == 4


def test_smollm2_pp2_equals_tp1(embedded_engine):
    """TP=1 reference: the suite's shared embedded engine. A lighter workload than the tiny
    model's (one pass with logprobs; the PP engine still chunks its prefill and retracts)."""
    def run(engine: Engine) -> list:
        out = engine.generate(PROMPTS[:4], GREEDY, return_logprob=True)
        engine.check_idle_integrity()
        return [(r["output_ids"], r["meta_info"]["output_token_logprobs"]) for r in out]

    ref = run(embedded_engine)
    with Engine(pp_size=2, **NO_GRAMMAR) as engine:
        got = run(engine)
    for (ids, logprobs), (want_ids, want_logprobs) in zip(got, ref):
        assert ids == want_ids
        assert max(abs(g[0] - w[0]) for g, w in zip(logprobs, want_logprobs)) < 1e-4

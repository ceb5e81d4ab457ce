"""Acceptance of pipeline parallelism on CPU (gloo): PP engines give the TP=1 greedy outputs
token for token and logprobs within 1e-4 over the TP acceptance workload (a mixed batch,
chunked prefill with a 16-token budget, a KV pool small enough to force retraction, cache hits
on the second pass, grammar-constrained and seeded sampling); every rank of every stage passes
the idle invariant.

The tiny model (2 layers, tied embeddings: both stages hold the embedding) runs at PP=2 x TP=2
(4 processes), the embedded SmolLM2 (30 layers) at PP=2 x TP=1. (Model-level cases: uneven and
4-stage splits, MoE with EP inside the stages: test_pp_models.py.)
"""
from __future__ import annotations

import pytest

from sgdsl.runtime import Engine

from .test_tp_engine import SMALL, TINY, assert_same, run_mixed


@pytest.fixture(scope="module")
def tiny_ref(tiny_model_dir):
    with Engine(str(tiny_model_dir), **TINY) as engine:
        return run_mixed(engine)


def test_tiny_pp2_tp2_equals_tp1(tiny_model_dir, tiny_ref):
    with Engine(str(tiny_model_dir), pp_size=2, tp_size=2, **TINY) as engine:
        assert_same(run_mixed(engine), tiny_ref)
        assert len(engine._tm.procs) == 4


def test_smollm2_pp2_equals_tp1(embedded_engine):
    """TP=1 reference: the suite's shared embedded engine (as test_tp_engine's TP=3 case)."""
    ref = run_mixed(embedded_engine, extra=False)
    with Engine(pp_size=2, **SMALL) as engine:
        assert_same(run_mixed(engine, extra=False), ref)

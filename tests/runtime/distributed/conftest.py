"""Fixtures of the parallel engine tests (TP, PP): the TP=1 answers of the tiny random model to
the mixed workload (mixed_workload.py), computed once for the session on the suite's shared
``tiny_engine`` (tests/conftest.py): the same dummy weights, and greedy tokens and logprobs do
not depend on chunked prefill or retraction (the parallel engine under test has both on; the
SmolLM2 tests use the shared embedded engine the same way). A TP=1 engine of its own would
cost the 2-core CI box seconds of start-up."""
from __future__ import annotations

import pytest

from .mixed_workload import run_mixed


@pytest.fixture(scope="session")
def tiny_ref(tiny_engine) -> dict:
    return run_mixed(tiny_engine)

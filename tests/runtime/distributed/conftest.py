"""Fixtures of the parallel engine tests (TP, PP): the TP=1 answers of the tiny random model to
the mixed workload (mixed_workload.py), computed once for the session: every parallel layout
of that model must equal them, and a TP=1 engine's start and workload cost the 2-core CI box
seconds per module."""
from __future__ import annotations

import pytest

from .mixed_workload import TINY, run_mixed


@pytest.fixture(scope="session")
def tiny_ref(tiny_model_dir) -> dict:
    from sgdsl.runtime import Engine

    with Engine(str(tiny_model_dir), **TINY) as engine:
        return run_mixed(engine)

"""Fixtures of the scheduler tests: ``make_harness`` builds a Scheduler over the stand-in model
(see ``standin.py``) and asserts the idle invariant after the test."""
from __future__ import annotations

import pytest

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.scheduler.scheduler import Scheduler

from .standin import EOS, Harness, StandInRunner


@pytest.fixture
def make_harness():
    made = []

    def make(num_slots: int = 512, ratio: float = 0.7, **cfg) -> Harness:
        runner = StandInRunner(num_slots, max_reqs=cfg.pop("max_reqs", 16))
        config = EngineConfig(**cfg)
        h = Harness(None, runner)  # type: ignore[arg-type]
        h.sched = Scheduler(runner, config, [EOS], None, h.send, init_new_token_ratio=ratio)
        made.append(h)
        return h

    yield make
    for h in made:  # the idle invariant after every scheduler test
        h.check_idle()

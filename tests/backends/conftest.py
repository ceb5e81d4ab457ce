"""Fixtures: the runtime backends (Local over a fake Engine, RuntimeEndpoint over an httpx
MockTransport), both answering from one ``FakeRuntime`` (see srt_fakes)."""
from __future__ import annotations

from typing import Any

import pytest

from sgdsl.backends.local import Local
from srt_fakes import FakeEngine, FakeRuntime, make_endpoint


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture(params=["Local", "RuntimeEndpoint"])
def srt_backend(request: pytest.FixtureRequest, runtime: FakeRuntime) -> Any:
    if request.param == "Local":
        return Local(engine=FakeEngine(runtime))
    return make_endpoint(runtime)

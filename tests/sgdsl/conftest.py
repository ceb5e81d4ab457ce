"""Shared fixtures for the language tests: everything runs on the ScriptedBackend."""
from __future__ import annotations

import pytest

from sgdsl import config


@pytest.fixture(autouse=True)
def _no_default_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: a test must never fall through to Local() (it would load the embedded model).
    monkeypatch.setattr(config, "_default", None)
    monkeypatch.setenv(config.ENV_VAR, "scripted")

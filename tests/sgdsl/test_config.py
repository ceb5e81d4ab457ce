"""Backend choice: argument > set_default_backend > SGDSL_BACKEND > config file > Local()."""
from __future__ import annotations

import pytest

import sgdsl as sgl
from sgdsl import config
from sgdsl.errors import BackendConfigError
from sgdsl.testing import ScriptedBackend


def test_precedence_argument_then_default_then_env(monkeypatch):
    arg, default = ScriptedBackend(), ScriptedBackend()
    assert config.resolve_backend(arg) is arg
    sgl.set_default_backend(default)
    assert config.resolve_backend(None) is default
    monkeypatch.setattr(config, "_default", None)
    assert isinstance(config.resolve_backend(None), ScriptedBackend)  # SGDSL_BACKEND=scripted


def test_config_files_are_found_in_parents(tmp_path, monkeypatch):
    monkeypatch.delenv(config.ENV_VAR)
    (tmp_path / "pyproject.toml").write_text('[tool.sgdsl]\nbackend = "openai:gpt-4o-mini"\n')
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert config.configured_spec(nested) == "openai:gpt-4o-mini"
    (nested / "sgdsl.toml").write_text('backend = "http://127.0.0.1:30000"\n')
    assert config.configured_spec(nested) == "http://127.0.0.1:30000"
    monkeypatch.setenv(config.ENV_VAR, "anthropic:claude-x")
    assert config.configured_spec(nested) == "anthropic:claude-x"


def test_spec_strings_build_backends_by_name(monkeypatch):
    built = []

    class Fake:
        def __init__(self, *args):
            built.append((type(self).__name__, args))

    import sgdsl.backends as backends
    for name in ("Local", "OpenAI", "RuntimeEndpoint"):
        monkeypatch.setattr(backends, name, type(name, (Fake,), {}), raising=False)
    config.backend_from_spec("local")
    config.backend_from_spec("local:/models/x")
    config.backend_from_spec("openai:gpt-4o-mini")
    config.backend_from_spec("http://h:1")
    assert built == [("Local", ()), ("Local", ("/models/x",)), ("OpenAI", ("gpt-4o-mini",)),
                     ("RuntimeEndpoint", ("http://h:1",))]
    with pytest.raises(BackendConfigError, match="needs a model"):
        config.backend_from_spec("anthropic")
    with pytest.raises(BackendConfigError, match="unknown backend spec"):
        config.backend_from_spec("ftp://x")

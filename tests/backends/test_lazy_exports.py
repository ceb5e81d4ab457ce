"""``import sgdsl.backends`` stays light: no torch, openai or anthropic until a backend of that
kind is used."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _loaded_after(code: str) -> set[str]:
    probe = code + "\nimport sys; print(' '.join(m for m in ('torch', 'openai', 'anthropic') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_importing_the_package_loads_no_client_or_torch():
    assert _loaded_after("import sgdsl.backends as b; b.Backend; b.Context") == set()


def test_each_backend_loads_only_its_client():
    assert _loaded_after("from sgdsl.backends import OpenAI; OpenAI('m', api_key='k')") == {"openai"}
    assert _loaded_after("from sgdsl.backends import RuntimeEndpoint") == set()


def test_unknown_name_is_an_attribute_error():
    import sgdsl.backends as backends

    with pytest.raises(AttributeError, match="Nope"):
        backends.Nope  # noqa: B018

"""Runs every program in examples/ with the embedded model. ``quickstart.py`` runs exactly as
the README says (a fresh ``python examples/quickstart.py``, no configuration); the others run
in-process on the session's shared engine (as the default backend) to keep the suite cheap."""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import sgdsl as sgl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.slow  # the embedded model


@pytest.fixture
def run_example(backends, capsys):
    """Run ``examples/<name>`` as __main__ with the shared Local backend as the default."""
    def run(name: str) -> str:
        sgl.set_default_backend(backends["local"])
        try:
            runpy.run_path(str(EXAMPLES / name), run_name="__main__")
        finally:
            sgl.set_default_backend(None)
        return capsys.readouterr().out
    return run


def test_quickstart_runs_with_no_configuration():
    env = {k: v for k, v in os.environ.items() if k != "SGDSL_BACKEND"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=EXAMPLES.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].strip().startswith("system:")
    assert any("Paris" in line for line in lines if line.strip().startswith("assistant:"))


def test_chat(run_example):
    out = run_example("chat.py")
    replies = [line for line in out.splitlines() if line.startswith("assistant: ")]
    assert len(replies) == 2 and all(len(r) > len("assistant: ") for r in replies)


def test_fork_parallel(run_example):
    out = run_example("fork_parallel.py")
    assert "Tip 1: " in out and "Tip 2: " in out and "In summary," in out


def test_select_choices(run_example):
    out = run_example("select_choices.py").splitlines()
    labels = [line.rsplit("-> ", 1)[1] for line in out]
    assert labels[0] in ("positive", "negative") and labels[1] in ("positive", "negative")
    assert labels[2:] == ["Paris", "Berlin"]


def test_json_extraction(run_example):
    out = run_example("json_extraction.py")
    data = json.loads(out[: out.rindex("}") + 1])
    assert set(data) == {"name", "country", "population_millions"}
    assert isinstance(data["population_millions"], int)


def test_agent_loop(run_example):
    out = run_example("agent_loop.py")
    roles = [line.split(":", 1)[0].strip() for line in out.splitlines() if ":" in line]
    assert roles[:2] == ["system", "user"] and "assistant" in roles

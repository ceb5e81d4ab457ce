"""Engine process lifecycle: startup errors surface in the parent with the child's real
message, a dead scheduler process becomes EngineDeadError, shutdown leaves no child behind."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from sgdsl.runtime import Engine
from sgdsl.runtime.errors import EngineDeadError, InvalidRequestError, ModelLoadError


def test_missing_model_path_reports_child_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError) as info:
        Engine(str(missing))
    assert "does not exist" in str(info.value) and str(missing) in str(info.value)
    assert "Traceback" in info.value.child_traceback


def test_unknown_architecture_reports_child_error(tmp_path, tiny_model_dir):
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    cfg.update(architectures=["MadeUpForCausalLM"], model_type="madeup")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError) as info:
        Engine(str(tmp_path), load_format="dummy")
    assert "MadeUp" in str(info.value) or "madeup" in str(info.value)


def test_unknown_engine_option_fails_before_starting():
    with pytest.raises(InvalidRequestError) as info:
        Engine(not_an_option=1)
    assert info.value.field == "not_an_option"


def test_dead_child_context_manager_and_idempotent_shutdown(tiny_model_dir):
    # NOTE: no grammar backend in the engines here (no grammar is sent): its compile and
    # estimate workers are three processes that import torch, seconds of CPU for nothing
    with Engine(str(tiny_model_dir), load_format="dummy", max_total_tokens=512,
                num_threads=1, grammar_backend="none") as engine:
        proc = engine._tm.proc
        assert engine.generate("hi", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] <= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
        with pytest.raises(EngineDeadError):
            for _ in range(50):  # the watchdog notices within about a second
                engine.generate("hi", {"max_new_tokens": 2})
                time.sleep(0.2)
    assert not proc.is_alive()
    engine.shutdown()  # idempotent after the context manager's own shutdown
    with pytest.raises(EngineDeadError):
        engine.generate("hi")


def test_child_exits_when_parent_dies(tmp_path, tiny_model_dir):
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys\n"
        "from sgdsl.runtime import Engine\n"
        f"e = Engine({str(tiny_model_dir)!r}, load_format='dummy', max_total_tokens=512,"
        " num_threads=1, grammar_backend='none')\n"
        "print(e._tm.proc.pid, flush=True)\n"
        "os._exit(0)  # die without shutdown or atexit\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300)
    child = int(out.stdout.strip().splitlines()[-1])
    for _ in range(100):  # the child polls its parent about once a second
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with open(f"/proc/{child}/status") as f:  # a zombie (exited, unreaped) also counts as gone
        assert "zombie" in f.read(), f"scheduler process {child} outlived its parent"

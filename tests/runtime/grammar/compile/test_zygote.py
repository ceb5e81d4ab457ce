"""The grammar helpers' zygote (runtime/grammar/compile/zygote.py): a worker is forked from it
with the parent's environment, ``sys.path`` and pipes; its exit status (a code or a signal)
reaches the parent; a worker dies with the zygote, and the zygote with its parent; with the
switch off, or without the zygote, a worker is a fresh interpreter as before."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sgdsl.runtime.grammar.compile import zygote
from processes import pid_alive

# prints its parent's pid, an env var and whether tests/ is importable, then echoes a line
ECHO = ("import os, sys; import processes; "
        "print(os.getppid(), os.environ.get('ZYGOTE_TEST'), flush=True); "
        "print(sys.stdin.readline().strip(), flush=True)")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **extra}


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_a_worker_is_forked_with_our_env_path_and_pipes():
    proc = zygote.start_worker(ECHO, _env(ZYGOTE_TEST="x"))
    assert isinstance(proc, zygote.ForkedWorker)
    parent, value = proc.stdout.readline().decode().split()
    assert int(parent) == zygote._shared[1].proc.pid and value == "x"  # the zygote's child
    proc.stdin.write(b"hello\n")
    assert proc.stdout.readline() == b"hello\n"
    assert proc.wait(timeout=30) == 0 and proc.poll() == 0


def test_exit_codes_and_signals_reach_the_parent():
    assert zygote.start_worker("raise SystemExit(3)", _env()).wait(timeout=30) == 3
    assert zygote.start_worker("raise KeyError('x')", _env()).wait(timeout=30) == 1
    proc = zygote.start_worker("import time; time.sleep(60)", _env())
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc = zygote.start_worker("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", _env())
    assert proc.wait(timeout=30) == -signal.SIGSEGV


def test_a_dead_zygote_takes_its_workers_and_is_replaced(monkeypatch):
    # a zygote of its own: this process's shared one serves other tests' compile workers
    monkeypatch.setattr(zygote, "_shared", (os.getpid(), zygote.Zygote(_env())))
    proc = zygote.start_worker("import time; time.sleep(60)", _env())
    old = zygote._shared[1].proc
    old.kill()
    old.wait(timeout=30)
    assert _wait_gone(proc.pid)
    assert proc.wait(timeout=30) == -signal.SIGKILL  # no status came: killed with the zygote
    fresh = zygote.start_worker("pass", _env())
    assert isinstance(fresh, zygote.ForkedWorker) and fresh.wait(timeout=30) == 0
    assert zygote._shared[1].proc.pid != old.pid
    zygote._shared[1].proc.kill()
    zygote._shared[1].proc.wait(timeout=30)


def test_the_zygote_exits_with_its_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys\n"
        "from sgdsl.runtime.grammar.compile import zygote\n"
        f"sys.path[:0] = {sys.path!r}\n"
        "w = zygote.start_worker('import time; time.sleep(60)', dict(os.environ))\n"
        "print(zygote._shared[1].proc.pid, w.pid, flush=True)\n"
        "os._exit(0)  # die without shutdown or atexit\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=_env())
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    assert all(_wait_gone(pid) for pid in pids)


def test_switched_off_a_worker_is_a_fresh_interpreter():
    proc = zygote.start_worker(ECHO, _env(SGDSL_GRAMMAR_ZYGOTE="0", ZYGOTE_TEST="y"))
    assert isinstance(proc, subprocess.Popen)
    parent, value = proc.stdout.readline().decode().split()
    assert int(parent) == os.getpid() and value == "y"
    proc.stdin.write(b"bye\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"bye\n" and proc.wait(timeout=30) == 0

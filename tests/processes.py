"""Process and port helpers shared by tests that start servers, ranks or workers.

Importable from any test as ``from processes import pid_alive, free_port``: pytest puts
``tests/`` on ``sys.path`` for the suite's root ``conftest.py``.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def free_port() -> int:
    """A loopback TCP port free right now (another process may still take it before use)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc; zombies count as gone)."""
    parent_of: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parent_of[int(entry)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in parent_of.items() if parent in frontier]
        found += kids
        frontier = kids
    return found


def listening_line(proc: subprocess.Popen) -> str:
    """The "listening on URL" line a server started with ``stdout=PIPE`` (text) prints; the rest
    of its output is drained on a thread so the pipe never fills (echoed to stderr when
    ``SGDSL_TEST_SERVER_LOG`` is set)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "listening on" in line:
            threading.Thread(target=_drain, args=(proc,), daemon=True).start()
            return line
    raise AssertionError("server did not start:\n" + "".join(lines[-40:]))


def _drain(proc: subprocess.Popen) -> None:
    for line in proc.stdout:
        if os.environ.get("SGDSL_TEST_SERVER_LOG"):
            sys.stderr.write(line)


def url_of(proc: subprocess.Popen) -> str:
    """The URL of a server's "listening on URL" line (``listening_line``)."""
    return listening_line(proc).split("listening on ")[1].split()[0]


def stop_tree(proc: subprocess.Popen, timeout_s: float = 60) -> int:
    """SIGTERM ``proc`` and assert that it exits within ``timeout_s`` and every process it
    started is gone within half that again (a server must not leave its scheduler or workers
    behind). Returns its exit code."""
    kids = descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()  # not left running past the test
            raise
    deadline = time.monotonic() + timeout_s / 2
    while [k for k in kids if pid_alive(k)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [k for k in kids if pid_alive(k)], "server processes left behind"
    return proc.returncode


def run_ranks(target, args_of, ranks: int, want: int) -> list:
    """Start ``ranks`` spawned processes ``target(*args_of(rank, results))`` and collect the
    ``want`` items they put on ``results``; a rank that dies with an error fails the test at
    once (no wait for the rest), and every rank must exit cleanly."""
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=args_of(r, results), daemon=True)
             for r in range(ranks)]
    for p in procs:
        p.start()
    got: list = []
    try:
        while len(got) < want:
            try:
                got.append(results.get(timeout=1))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and p.exitcode]
                assert not dead, f"rank(s) {dead} died (see their stderr)"
                if not any(p.is_alive() for p in procs):  # what they sent last may be in flight
                    try:
                        got.append(results.get(timeout=5))
                    except queue.Empty:
                        raise AssertionError(f"every rank exited after sending {len(got)} "
                                             f"of {want} results") from None
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    return got

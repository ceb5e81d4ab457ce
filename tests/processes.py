"""Process and port helpers shared by tests that start servers, ranks or workers.

Importable from any test as ``from processes import pid_alive, free_port``: pytest puts
``tests/`` on ``sys.path`` for the suite's root ``conftest.py``.
"""
from __future__ import annotations

import os
import socket


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

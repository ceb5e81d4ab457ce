"""What the benchmarks read about a process from Linux's /proc: its CPU seconds, the processes
below it, and a process tree's resident memory (a server's scheduler, ranks and grammar
workers are its descendants)."""
from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (the state first)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads); 0.0 where /proc
    has no such process (it ended, or no Linux)."""
    try:
        fields = _stat(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, its children first."""
    parent_of: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent_of[int(entry)] = int(_stat(int(entry))[1])
        except OSError:  # ended meanwhile
            pass
    found, frontier = [], [pid]
    while frontier:
        frontier = [p for p, parent in parent_of.items() if parent in frontier]
        found += frontier
    return found


def tree_rss(root: int) -> int:
    """Resident memory of ``root`` and all its descendants, bytes."""
    total = 0
    for pid in [root, *descendants(root)]:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf(
                "SC_PAGE_SIZE")
        except OSError:
            pass
    return total

"""The engine main process's words for its worker processes' failures (one scheduler process,
or one per tensor-parallel rank of this node): which one exited or hung."""
from __future__ import annotations

from typing import Any


def dead_worker(procs: list[Any]) -> tuple[str, int | None] | None:
    """(which worker process, its exit code) for the one that most likely exited first; None:
    all alive. NOTE: when one rank dies the others' collectives fail and they exit too, often
    before the watchdog looks: a rank killed by a signal is named before one that exited with
    an error, and another rank before rank 0 (it fails when a peer dies, see crash_text)."""
    dead = [(rank, proc) for rank, proc in enumerate(procs) if not proc.is_alive()]
    if not dead:
        return None
    rank, proc = min(dead, key=lambda d: (not (d[1].exitcode or 0) < 0, d[0] == 0, d[0]))
    what = ("scheduler process" if len(procs) == 1 else
            f"tensor-parallel rank {rank} (pid {proc.pid})")
    return what, proc.exitcode


def crash_text(procs: list[Any], text: str) -> str:
    """Rank 0's crash report; under TP it usually crashed because another rank died (its
    collective failed): that rank is named first."""
    dead = next(((r, p) for r, p in enumerate(procs) if r and not p.is_alive()), None)
    if dead is None:
        return text
    rank, proc = dead
    return (f"tensor-parallel rank {rank} (pid {proc.pid}) exited unexpectedly (exit code "
            f"{proc.exitcode}); rank 0 then failed: {text}")


def hung_text(ranks: list[int], timeout_s: float) -> str:
    return (f"tensor-parallel rank(s) {', '.join(map(str, ranks))} made no progress for "
            f"{timeout_s:g} s (hung; stopped with the whole group)")


def kill_all(procs: list[Any]) -> None:
    """The others would wait on a dead or hung rank forever (a collective): stop every one,
    so nothing is orphaned and no device memory stays held."""
    for proc in procs:
        if proc.is_alive():
            proc.kill()

"""Replica server processes: each a full ``python -m sgdsl.runtime.server`` on a private
loopback port, with its own scheduler (a TP group of ``tp_size`` ranks given its own slice of
the GPUs through CUDA_VISIBLE_DEVICES). Started together, watched (their URL from the line they
print once listening, their last lines kept for errors), stopped together; a replica dies with
its parent even if the parent is killed (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from ..errors import InvalidRequestError

START_TIMEOUT_S = 1800.0  # loading a 70B checkpoint takes a while


@dataclass
class Replica:
    index: int
    proc: subprocess.Popen
    url: str = ""
    lines: list[str] | None = None


def gpu_slices(dp_size: int, tp_size: int, device: str) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES per replica (None: leave the environment alone, e.g. on CPU)."""
    if device == "cpu":
        return [None] * dp_size
    try:
        import torch
    except ImportError:
        return [None] * dp_size
    if not torch.cuda.is_available():
        if device == "cuda":
            raise InvalidRequestError("device: cuda requested but no GPU is visible",
                                      field="device")
        return [None] * dp_size
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    need = dp_size * tp_size
    if need > len(ids):
        raise InvalidRequestError(f"dp_size: dp_size x tp_size = {need} GPUs, but only "
                                  f"{len(ids)} are visible", field="dp_size")
    return [",".join(ids[i * tp_size:(i + 1) * tp_size]) for i in range(dp_size)]


def _die_with_parent() -> None:
    """Linux: the replica gets SIGTERM if this process dies, even by SIGKILL (no orphans)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def launch(index: int, argv: Sequence[str], gpus: str | None) -> Replica:
    cmd = [sys.executable, "-m", "sgdsl.runtime.server", *argv,
           "--host", "127.0.0.1", "--port", "0"]  # the last flag wins
    env = dict(os.environ)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env=env, preexec_fn=_die_with_parent)
    return Replica(index, proc, lines=[])


def _watch(replica: Replica, ready: threading.Event) -> None:
    """Read a replica's output: note its URL, keep the last lines for errors, echo the rest."""
    assert replica.proc.stdout is not None and replica.lines is not None
    for line in replica.proc.stdout:
        if not replica.url and "listening on " in line:
            replica.url = line.split("listening on ")[1].split()[0]
            ready.set()
            continue
        replica.lines = (replica.lines + [line])[-40:]
        sys.stderr.write(f"[dp{replica.index}] {line}")
    ready.set()  # exited


def start_replicas(dp_size: int, argv: Sequence[str], gpus: list[str | None],
                   timeout_s: float = START_TIMEOUT_S) -> list[Replica]:
    replicas = [launch(i, argv, gpus[i]) for i in range(dp_size)]
    events = [threading.Event() for _ in replicas]
    for replica, event in zip(replicas, events):
        threading.Thread(target=_watch, args=(replica, event), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    for replica, event in zip(replicas, events):
        event.wait(max(0.0, deadline - time.monotonic()))
        if not replica.url:
            stop_replicas(replicas)
            tail = "".join(replica.lines or [])[-3000:]
            raise RuntimeError(f"data-parallel replica {replica.index} did not start "
                               f"(exit code {replica.proc.poll()}):\n{tail}")
    return replicas


def stop_replicas(replicas: list[Replica], grace_s: float = 30.0) -> None:
    for r in replicas:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for r in replicas:
        try:
            r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()

"""The parent's handle on one worker process (a compile worker, ``worker.py``, or the
completion-estimate worker, ``estimate_worker.py``): start it, talk to it in length-prefixed
pickle frames over its pipes, wait for a reply with a deadline, kill it.

The pipes are read as raw file descriptors with ``select``, so a deadline is exact and no
buffered byte hides from ``select``. A wait may also end when the worker has used a given
amount of CPU time (``recv``'s ``cpu_limit``): a compile's deadline counts the compile's own
work, so a loaded machine, where a compile's wall time stretches, does not fail it.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import time
from typing import Any

from .worker import FRAME_HEADER, PARENT_ENV
from .zygote import prestart, start_worker

COMPILE_WORKER = "from sgdsl.runtime.grammar.compile.worker import main; main()"
STARTUP_TIMEOUT_S = 120.0  # imports and the backend's tokenizer tables; slow on a loaded box
CPU_POLL_S = 0.05  # how often a wait with a CPU-time limit reads the worker's CPU time
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class WorkerStartError(Exception):
    pass


def worker_env() -> dict[str, str]:
    """A worker's environment (also the zygote's, whose imports read the thread counts)."""
    # NOTE: the parent's sys.path goes along so the worker unpickles the same modules
    # (a backend defined outside the installed packages, e.g. in a test, included).
    return {**os.environ, PARENT_ENV: str(os.getpid()), "OMP_NUM_THREADS": "1",
            "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def prestart_zygote(backend: str | None = None) -> None:
    """Start the workers' zygote now (``zygote.prestart``): its imports overlap the caller's
    next work instead of delaying the first worker; ``backend``'s imports included."""
    prestart(worker_env(), backend)


class WorkerHandle:
    """One worker process and its pipes (raw file descriptors: ``select`` must see all data)."""

    def __init__(self, init: Any, command: str = COMPILE_WORKER) -> None:
        """``init``: the first frame the worker reads (``worker.WorkerInit`` for a compile
        worker); ``command``: the Python code that runs the worker's ``main``."""
        # NOTE: forked from this process's zygote where it can (zygote.py): the imports a
        # worker needs cost seconds of CPU each time otherwise
        self.proc = start_worker(command, worker_env())
        self._in = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self._out = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self.baseline = 0  # VmData after its first compile (set by the pool)
        self._init = init

    def handshake(self) -> None:
        """Send the init frame and wait until the backend is built; WorkerStartError if not."""
        try:
            self.send(self._init)
            reply = self.recv(time.monotonic() + STARTUP_TIMEOUT_S)
        except (EOFError, OSError):
            reply = ("startup_error", f"the worker exited ({self.exit_text()})")
        if reply is None or reply[0] != "ready":
            self.kill()
            raise WorkerStartError(reply[1] if reply else "the worker did not start in time")

    def send(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(FRAME_HEADER.pack(len(data)) + data)
        while view:
            view = view[os.write(self._in, view):]

    def recv(self, deadline: float, cpu_limit: float | None = None) -> Any | None:
        """The next frame, or None once ``deadline`` (monotonic) passes or the worker's CPU
        time (``cpu_seconds``) reaches ``cpu_limit``; EOFError if the worker died."""
        head = self._read(FRAME_HEADER.size, deadline, cpu_limit)
        if head is None:
            return None
        body = self._read(FRAME_HEADER.unpack(head)[0], deadline, None)
        return None if body is None else pickle.loads(body)

    def cpu_seconds(self) -> float | None:
        """CPU time the worker has used (user + system), None where unknown (not Linux)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def _read(self, size: int, deadline: float, cpu_limit: float | None) -> bytes | None:
        chunks, left = [], size
        while left:
            wait = deadline - time.monotonic()
            if cpu_limit is not None:
                # NOTE: checked every CPU_POLL_S: at most that much compile past the limit
                wait = min(wait, CPU_POLL_S)
            if wait <= 0:
                return None
            if not select.select([self._out], [], [], wait)[0]:
                used = self.cpu_seconds() if cpu_limit is not None else None
                if time.monotonic() >= deadline or used is not None and used >= cpu_limit:
                    return None
                continue
            chunk = os.read(self._out, min(left, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()

    def close(self) -> None:
        """Close the pipes (an idle worker exits on EOF) and reap the process."""
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def exit_text(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "still running"
        if code < 0:
            return signal.Signals(-code).name if -code in signal.valid_signals() else str(code)
        return f"exit code {code}"

"""The grammar helpers' zygote: one process per parent that imports what a compile worker
(``worker.py``) or the estimate worker (``forcing/estimate_worker.py``) needs (torch,
transformers, xgrammar, outlines-core: ~4 s of CPU) once, then forks each worker from that
state, so an engine's three helpers, and every worker replaced after a deadline or a crash,
start in milliseconds instead of importing all of it again (seconds of CPU each, on the cores
the model needs).

The zygote is a fresh interpreter (never a fork of the scheduler, which has threads and maybe
CUDA) and stays single-threaded, so forking it is safe. A worker forked from it is what
``python -c COMMAND`` would be: its stdin/stdout are pipes to the parent (sent over a Unix
socket with ``SCM_RIGHTS``), its environment and ``sys.path`` the parent's at the request. The
zygote reaps its children and writes each one's exit status (``Popen.returncode``'s
convention) to a third pipe, which ``ForkedWorker.poll``/``wait`` read. The zygote exits when
its parent does (EOF on its socket); its children then die too (``worker.die_with_parent``).
Where the zygote cannot start, or ``SGDSL_GRAMMAR_ZYGOTE=0``, workers are started as before,
one interpreter each.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

ENV_SWITCH = "SGDSL_GRAMMAR_ZYGOTE"  # "0": one fresh interpreter per worker
FD_ENV = "SGDSL_GRAMMAR_ZYGOTE_FD"  # the zygote's end of its socket
ZYGOTE = "from sgdsl.runtime.grammar.compile.zygote import main; main()"
PRELOAD = ("sgdsl.runtime.grammar.compile.worker", "sgdsl.runtime.grammar.forcing.estimate_worker",
           "sgdsl.runtime.grammar.backends.xgrammar", "sgdsl.runtime.grammar.backends.outlines")
# Named by the caller where it knows its backend (``prestart``): every worker unpickles the
# backend's HF tokenizer (transformers) and the xgrammar backend imports xgrammar, ~1.3 + 1.5 s
# of CPU in each worker forked without them (benchmarks/RESULTS.md, branch ``suite-fast2``).
PRELOAD_ENV = "SGDSL_GRAMMAR_ZYGOTE_PRELOAD"  # more modules to import, comma-separated
TOKENIZER_MODULE = "transformers.tokenization_utils_tokenizers"
BACKEND_PRELOAD = {"xgrammar": ("xgrammar",)}
STARTUP_TIMEOUT_S = 120.0  # as worker_handle's: imports are slow on a loaded box
_STATUS = struct.Struct(">i")
_PID = struct.Struct(">q")
_KILLED_WITH_ZYGOTE = -signal.SIGKILL


class ForkedWorker:
    """A worker forked by the zygote, with the part of ``subprocess.Popen``'s interface
    ``WorkerHandle`` uses (it is the zygote's child: its exit status comes from the zygote)."""

    def __init__(self, pid: int, stdin: int, stdout: int, status: int) -> None:
        self.pid = pid
        self.stdin = os.fdopen(stdin, "wb", buffering=0)
        self.stdout = os.fdopen(stdout, "rb", buffering=0)
        self.returncode: int | None = None
        self._status = status
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._wait(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        if self.poll() is None:  # not reaped yet: the pid is still this worker's
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _wait(self, timeout: float | None) -> int | None:
        # NOTE: a lock, as Popen's: a slot's thread waits while shutdown's kills (one reader)
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return self.returncode
        try:
            if self.returncode is None and select.select([self._status], [], [], timeout)[0]:
                data = os.read(self._status, _STATUS.size)
                # EOF without a status: the zygote died, and its children with it
                self.returncode = _STATUS.unpack(data)[0] if len(data) == _STATUS.size \
                    else _KILLED_WITH_ZYGOTE
                os.close(self._status)
            return self.returncode
        finally:
            self._lock.release()


class Zygote:
    """The parent's side: starts the zygote, asks it for workers (one at a time)."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env={**env, FD_ENV: str(theirs.fileno())}, pass_fds=(theirs.fileno(),))
        theirs.close()
        ours.settimeout(STARTUP_TIMEOUT_S)  # its imports come first; a hung zygote is dropped
        self._sock = ours
        self._lock = threading.Lock()

    def fork(self, command: str, env: dict[str, str]) -> ForkedWorker:
        """A worker running ``command`` with ``env``; OSError/EOFError if the zygote is gone."""
        child_in, our_in = os.pipe()
        our_out, child_out = os.pipe()
        our_status, zygote_status = os.pipe()
        request = pickle.dumps((command, env, list(sys.path)))
        try:
            with self._lock:
                socket.send_fds(self._sock, [struct.pack(">Q", len(request)) + request],
                                [child_in, child_out, zygote_status])
                pid = _recv_exact(self._sock, _PID.size)
        except BaseException:
            for fd in (our_in, our_out, our_status):
                os.close(fd)
            self.proc.kill()
            raise
        finally:
            for fd in (child_in, child_out, zygote_status):
                os.close(fd)
        return ForkedWorker(_PID.unpack(pid)[0], our_in, our_out, our_status)


_shared: tuple[int, Zygote] | None = None  # (the pid that started it, the zygote)
_shared_lock = threading.Lock()


def _zygote(env: dict[str, str]) -> Zygote | None:
    """This process's zygote, started now with ``env`` if it has none (or it died); None
    where workers start the old way."""
    global _shared
    if env.get(ENV_SWITCH, "1") == "0" or not hasattr(socket, "send_fds"):
        return None
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid() or _shared[1].proc.poll() is not None:
            try:
                _shared = (os.getpid(), Zygote(env))
            except OSError:
                _shared = None
        return _shared[1] if _shared is not None else None


def prestart(env: dict[str, str], backend: str | None = None) -> None:
    """Start this process's zygote now, so that its imports (seconds of CPU, one core) run
    while the caller does other work: the scheduler process loads the model meanwhile
    (scheduler/process.py), where the first worker's start used to wait for both in turn.
    ``backend``: the grammar backend the workers will build; its imports and the tokenizer's
    are done in the zygote too, once, not in every worker."""
    extra = (TOKENIZER_MODULE, *BACKEND_PRELOAD.get(backend or "", ()))
    _zygote({**env, PRELOAD_ENV: ",".join(extra)} if backend else env)


def start_worker(command: str, env: dict[str, str]) -> Any:
    """A worker process running ``python -c command`` with ``env``: forked by this process's
    zygote (started on first use, or by ``prestart``), else a fresh interpreter
    (``subprocess.Popen``)."""
    global _shared
    if env.get(ENV_SWITCH, "1") != "0" and hasattr(socket, "send_fds"):
        zygote = _zygote(env)
        if zygote is not None:
            try:
                return zygote.fork(command, env)
            except (OSError, EOFError):  # the zygote died: this worker starts the old way
                with _shared_lock:
                    _shared = None
    return subprocess.Popen([sys.executable, "-c", command], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, bufsize=0, env=env)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the grammar zygote exited")
        data += chunk
    return data


# -- the zygote process ---------------------------------------------------------------------------
def main() -> None:
    import gc
    import importlib

    from .worker import set_process_name

    set_process_name("sgdsl-zygote")
    sock = socket.socket(fileno=int(os.environ.pop(FD_ENV)))
    extra = tuple(n for n in os.environ.pop(PRELOAD_ENV, "").split(",") if n)
    for name in PRELOAD + extra:
        try:
            importlib.import_module(name)
        except ImportError:  # a backend not installed: its workers import nothing more
            pass
    gc.freeze()  # the imports' objects stay shared with every child (no copy-on-write)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    statuses: dict[int, int] = {}  # child pid -> the pipe its exit status goes to
    while True:
        ready = select.select([sock, wake_r], [], [])[0]
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(statuses)
        if sock in ready:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
            except OSError:
                msg, fds = b"", []
            if not msg:  # the parent is gone
                return
            size = struct.unpack(">Q", msg[:8])[0]
            body = msg[8:]
            if len(body) < size:
                body += _recv_exact(sock, size - len(body))
            pid = os.fork()
            if pid == 0:
                _child(pickle.loads(body), fds)
            os.close(fds[0])
            os.close(fds[1])
            statuses[pid] = fds[2]
            sock.sendall(_PID.pack(pid))
            _reap(statuses)


def _reap(statuses: dict[int, int]) -> None:
    while statuses:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, _STATUS.pack(os.waitstatus_to_exitcode(status)))
            except OSError:  # the parent let go of this worker without waiting for it
                pass
            os.close(fd)


def _child(request: tuple, fds: list[int]) -> None:
    """In the forked worker: become ``python -c command`` on the parent's pipes."""
    command, env, path = request
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)
        from .worker import PARENT_ENV, die_with_parent

        os.environ.clear()
        os.environ.update(env)
        os.environ[PARENT_ENV] = str(os.getppid())  # die_with_parent: the zygote is the parent
        die_with_parent()  # whatever the command: the zygote exits when its parent does
        sys.path[:0] = [p for p in path if p not in sys.path]
        exec(compile(command, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as an interpreter would: the traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

"""The compile worker process: builds one grammar backend, then compiles keys sent by its parent
(``worker_pool.py``) one at a time, under a memory limit.

Started as ``python -c "...worker import main; main()"`` (a fresh interpreter: never a fork of
the scheduler, which has threads and maybe CUDA). It talks over its stdin/stdout pipes in
length-prefixed pickle frames:

- parent -> worker, once: ``WorkerInit`` (how to build the backend, the memory budget);
  worker -> parent: ``("ready", None)`` or ``("startup_error", message)``.
- parent -> worker, per job: ``(job_id, key)``; worker -> parent: ``(job_id, "ok", payload,
  compile_s, data_bytes)`` with the backend's ``ship``ped result, or ``(job_id, "error" |
  "memory", message)``. A backend that ``ships_again`` sends that result as ``(job_id,
  "compiled", ...)`` and then ``(job_id, "ok", payload or None, ...)`` with ``ship_again``'s
  payload (None: the first stands). Exceptions travel as text, so nothing unpicklable crosses
  the pipe.

The budget is applied with ``RLIMIT_DATA`` (heap and private mappings, not shared libraries) on
top of what the worker holds once its backend is built, so it means "memory one compile may
use". An allocation past it raises ``MemoryError`` (Python, C++) or aborts the process (Rust);
the parent reports either as over the limit. The worker dies with its parent (Linux
``PR_SET_PDEATHSIG``, and EOF on stdin otherwise).
"""
from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

FRAME_HEADER = struct.Struct(">Q")
# Compiles are background work: on a busy host the scheduler's decode steps come first.
WORKER_NICE = 5
PARENT_ENV = "SGDSL_GRAMMAR_WORKER_PARENT"  # the pid that started us (see die_with_parent)


@dataclass(frozen=True)
class WorkerInit:
    """What a worker needs to build its backend: a picklable factory (``registry.BackendSpec``)
    and the memory budget of one compile in bytes (0: unlimited)."""

    factory: Callable[[], Any]
    memory_bytes: int


def write_frame(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(FRAME_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: BinaryIO) -> Any:
    """The next frame; raises EOFError when the other side is gone."""
    head = stream.read(FRAME_HEADER.size)
    if len(head) < FRAME_HEADER.size:
        raise EOFError
    size = FRAME_HEADER.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def data_bytes() -> int:
    """This process's data segment (``VmData``: what ``RLIMIT_DATA`` counts); 0 if unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def serve(setup: Callable[[Any], Any], handle: Callable[[Any, Any], Any]) -> None:
    """The worker side of the frame protocol (this one's and ``estimate_worker``'s): the first
    frame goes to ``setup``, whose failure is answered ``("startup_error", text)`` and whose
    result is the worker's state; then every frame goes to ``handle(state, frame)``, whose
    result, unless None, is sent back. Returns when the parent closes the pipe."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print() in a library must not corrupt the frames
    die_with_parent()
    try:
        state = setup(read_frame(stdin))
    except EOFError:
        return
    except BaseException as e:  # noqa: BLE001 - the parent must learn why, not see a dead pipe
        write_frame(stdout, ("startup_error", f"{type(e).__name__}: {e}"))
        return
    write_frame(stdout, ("ready", None))
    while True:
        try:
            message = read_frame(stdin)
        except EOFError:
            return
        reply = handle(state, message)
        # NOTE: a generator's frames go out as it makes them (a result, then a better one)
        for frame in reply if isinstance(reply, types.GeneratorType) else [reply]:
            if frame is not None:
                write_frame(stdout, frame)


def main() -> None:
    try:
        os.nice(WORKER_NICE)
    except OSError:
        pass
    serve(_setup, lambda backend, job: _compile(backend, *job))


def _setup(init: WorkerInit) -> Any:
    backend = init.factory()
    _limit_memory(init.memory_bytes)
    return backend


def _compile(backend: Any, job_id: int, key: Any) -> Any:
    from ...errors import InvalidRequestError

    t0 = time.perf_counter()
    try:
        compiled = backend.compile(key)
        payload = backend.ship(compiled)
    except MemoryError:
        return (job_id, "memory", "")
    except InvalidRequestError as e:
        return (job_id, "error", e.message)
    except Exception as e:  # noqa: BLE001 - a bug or a native error: its text, never the object
        if "bad_alloc" in str(e):  # C++ out of memory, rethrown as a RuntimeError
            return (job_id, "memory", "")
        return (job_id, "error", f"{key.field} failed to compile: {type(e).__name__}: {e}")
    done = (job_id, "ok", payload, time.perf_counter() - t0, data_bytes())
    if not backend.ships_again:
        return done
    return _and_again(backend, compiled, done)


def _and_again(backend: Any, compiled: Any, done: tuple) -> Any:
    """The compile's frame as "compiled" (it fit the deadline), then ``ship_again``'s payload
    (None: the first stands; the parent gives this step a deadline of its own)."""
    yield (done[0], "compiled", *done[2:])
    try:
        again = backend.ship_again(compiled)
    except Exception:  # noqa: BLE001 - out of memory (C++ bad_alloc too): the first stands
        again = None
    yield (done[0], "ok", again, *done[3:])


def _limit_memory(budget: int) -> None:
    if budget <= 0:
        return
    import resource

    limit = data_bytes() + budget
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def die_with_parent() -> None:
    """Linux: SIGKILL this worker when the thread that started it (a pool slot) exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if str(os.getppid()) != os.environ.get(PARENT_ENV, str(os.getppid())):
        os._exit(0)  # the parent died before prctl: nobody will read our results


if __name__ == "__main__":
    main()

"""The compile worker process: builds one grammar backend, then compiles keys sent by its parent
(``worker_pool.py``) one at a time, under a memory limit.

Started as ``python -c "...worker import main; main()"`` would be (never a fork of the
scheduler, which has threads and maybe CUDA): forked from the grammar zygote, a fresh
interpreter that did the imports once (``zygote.py``), else a fresh interpreter. It talks over its stdin/stdout pipes in
length-prefixed pickle frames:

- parent -> worker, once: ``WorkerInit`` (how to build the backend, the memory budget);
  worker -> parent: ``("ready", None)`` or ``("startup_error", message)``.
- parent -> worker, per job: ``(job_id, key, meta_check)``; worker -> parent: ``(job_id, "ok",
  payload, compile_s, data_bytes, more)`` with the backend's ``ship``ped result, or
  ``(job_id, "error" | "memory", message)``. ``meta_check`` False: the JSON meta-schema check
  passed where the request was built, so only the compile runs. ``more``: the backend can also
  make a form that loads faster than ``ship``'s (``may_ship_again``; xgrammar: the serialized
  grammar) for the on-disk cache. The worker keeps that compile until its next job, and the
  parent may then ask ``(job_id, "again")``, answered ``(job_id, "again", payload or None)``:
  after the request was served, never on its admission path. Exceptions travel as text, so
  nothing unpicklable crosses the pipe.

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
import threading
import time
import types
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

FRAME_HEADER = struct.Struct(">Q")
# Compiles are background work: on a busy host the scheduler's decode steps come first.
WORKER_NICE = 5
PARENT_ENV = "SGDSL_GRAMMAR_WORKER_PARENT"  # the pid that started us (see die_with_parent)
# /proc/<pid>/comm of a compile worker: how ps, top and the tests tell one (its command line is
# the zygote's when it was forked from one, zygote.py)
WORKER_NAME = "sgdsl-compile"


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
    set_process_name(WORKER_NAME)
    serve(_setup, _handle)


@dataclass
class _State:
    """A worker's backend and its last compile (kept for an "again" request, until the next
    job)."""

    backend: Any
    last: tuple[int, Any] | None = None


def _setup(init: WorkerInit) -> _State:
    backend = init.factory()
    _limit_memory(init.memory_bytes)
    return _State(backend)


def _handle(state: _State, message: tuple) -> tuple:
    job_id, what, *meta_check = message
    last, state.last = state.last, None  # freed before a new compile takes memory
    if what == "again":
        return (job_id, "again", _again(state.backend, last[1])
                if last is not None and last[0] == job_id else None)
    reply, compiled = _compile(state.backend, job_id, what, meta_check != [False])
    if len(reply) > 5 and reply[5]:
        state.last = (job_id, compiled)
    return reply


def _compile(backend: Any, job_id: int, key: Any, meta_check: bool = True) -> tuple[tuple, Any]:
    """(the reply frame, the compiled grammar or None). ``meta_check`` False: the caller
    checked the schema against its meta-schema already (the Engine's front end does for
    every request)."""
    from ...errors import InvalidRequestError

    t0 = time.perf_counter()
    meta = _MetaCheck(key if meta_check else None)
    try:
        compiled = backend.compile(key)
        if meta.result() is None:
            payload = backend.ship(compiled)
            more = bool(backend.ships_again and backend.may_ship_again(compiled))
    except MemoryError:
        return (job_id, "memory", ""), None
    except InvalidRequestError as e:
        return (job_id, "error", meta.result() or e.message), None
    except Exception as e:  # noqa: BLE001 - a bug or a native error: its text, never the object
        if "bad_alloc" in str(e):  # C++ out of memory, rethrown as a RuntimeError
            return (job_id, "memory", ""), None
        return (job_id, "error", meta.result()
                or f"{key.field} failed to compile: {type(e).__name__}: {e}"), None
    if meta.result() is not None:
        return (job_id, "error", meta.result()), None
    return (job_id, "ok", payload, time.perf_counter() - t0, data_bytes(), more), compiled


class _MetaCheck:
    """A JSON schema's meta-schema check (``limits.check_meta_schema``, pure Python) on a
    thread beside the compile (native, without the GIL): admission pays the longer of the two,
    not their sum, and the scheduler's thread neither. Its error names the broken keyword and
    wins over the compile's."""

    def __init__(self, key: Any | None) -> None:
        self.error: str | None = None
        self._thread = None
        if key is not None and key.kind == "json_schema":
            self._thread = threading.Thread(target=self._run, args=(key,), daemon=True)
            self._thread.start()

    def _run(self, key: Any) -> None:
        from ...errors import InvalidRequestError
        from .limits import check_meta_schema

        try:
            check_meta_schema(key)
        except InvalidRequestError as e:
            self.error = e.message
        except Exception:  # noqa: BLE001 - the compile decides then
            pass

    def result(self) -> str | None:
        """Its error (None: the schema is valid, or not a JSON schema), once it is done."""
        if self._thread is not None:
            self._thread.join()
        return self.error


def _again(backend: Any, compiled: Any) -> bytes | None:
    """``ship_again``'s payload, or None where it fails (out of memory, C++ bad_alloc too):
    the first payload stands."""
    try:
        return backend.ship_again(compiled)
    except Exception:  # noqa: BLE001
        return None


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


def set_process_name(name: str) -> None:
    """Linux: this process's name (``/proc/<pid>/comm``, 15 bytes at most)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    main()

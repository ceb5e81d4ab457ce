"""Entry point of the scheduler process: build the model runner and the scheduler, announce
``Ready`` (or a ``StartupError`` with the real message and traceback), then loop.

The loop drains incoming messages without blocking while there is work, and blocks on the socket
when idle, so the hot path has no sleeps. The process exits on ``Shutdown``, or when its parent
dies (checked about once a second), so no orphan is left behind.

Tensor parallelism (``runtime/distributed``): one such process per rank. Every rank runs the
same scheduler over the same messages: rank 0 drains the socket and broadcasts what it got at
the top of each iteration, so all ranks admit, batch, retract, cache and free identically (each
rank's radix cache and allocator are the same, over a KV pool holding only its heads). The
logits are all-gathered and sampled on every rank, which all draw the same ids (no broadcast:
``distributed/sampled_ids.py``); grammar compiles finish when rank 0 says so (``tp_sync.py``).
Only rank 0 answers the main process; a follower's socket carries nothing but its own startup
error.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import sys
import time
import traceback
from typing import Any, Iterator

from .. import hop_times  # hops:
from ..config import EngineConfig
from ..fast_exit import exit_without_teardown
from ..distributed.heartbeat import Heartbeats
from ..ipc import messages as m
from ..ipc.channel import IpcPaths, SyncChannel
from .step_trace import make_trace

PARENT_CHECK_S = 1.0
IDLE_WAIT_MS = 500
# NOTE: below the main process's startup timeout (600 s), so a hung rank is named first.
RANK_STARTUP_SKEW_S = 300.0


def run_scheduler_process(config: EngineConfig, paths: IpcPaths | None, parent_pid: int,
                          spec: Any = None, beats: Any = None) -> None:
    """``spec``: this process's ``distributed.launch.RankSpec`` (None: the only rank).
    ``paths`` is None on the ranks of another node (nothing to report to but the log).
    ``beats``: shared loop counters the main process watches for hung ranks (or None)."""
    rank, size = (spec.rank, spec.size) if spec is not None else (0, 1)
    leader = rank == 0
    chan = SyncChannel(paths, receive=leader) if paths is not None else None
    where = f"tensor-parallel rank {rank}/{size}: " if size > 1 else ""
    scheduler, ready = _start(config, chan, spec, where)
    if not config.disable_gc_freeze:
        freeze_startup_objects()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    hop_times.watch_gc("scheduler")  # hops: long collections on stderr ($SGDSL_HOP_TIMES)
    if leader:
        chan.send(ready)
    try:
        beat = (lambda: None) if beats is None else functools.partial(
            Heartbeats.beat, beats, spec.local_rank)
        with _profiled(spec.rank if spec is not None else 0):
            _loop(scheduler, chan if leader else None, parent_pid, size > 1, beat,
                  make_trace(scheduler, rank))
    except BaseException as exc:  # noqa: BLE001
        _report(chan, m.StartupError(f"{where}scheduler crashed: {type(exc).__name__}: {exc}",
                                     traceback.format_exc(), "engine_dead"))
        raise SystemExit(1) from None
    else:
        if chan is not None:
            chan.close()
    finally:
        if scheduler.grammar is not None:
            scheduler.grammar.shutdown()  # grammar: kill the compile worker processes
        getattr(scheduler.tree, "close", lambda: None)()  # hicache: drain storage writes
    # NOTE: everything owed to others is done above (channel closed, compile workers killed,
    # grammar disk stores written, hicache writes drained); teardown would only spend seconds
    # collecting the heap (fast_exit.py)
    exit_without_teardown(0)


def _start(config: EngineConfig, chan: SyncChannel | None, spec: Any, where: str) -> tuple:
    """Join the rank group (if any), build the scheduler, wait for every rank; a failure is
    reported to the parent and ends this process."""
    rank, size = (spec.rank, spec.size) if spec is not None else (0, 1)
    try:
        if size > 1:
            from ..distributed.state import init_tp_group

            init_tp_group(rank, size, spec.device(config), spec.init_method,
                          ep_size=config.ep_size, pp_size=config.pp_size)  # pp: size = world
        built = _build(config, chan.send if rank == 0 else _drop)
        if size > 1:
            from ..distributed.collectives import barrier

            # Ready means every rank loaded; a rank still loading this long after rank 0 is
            # taken for hung, and rank 0's error names it
            barrier(RANK_STARTUP_SKEW_S)
        return built
    except BaseException as exc:  # noqa: BLE001 - every startup failure must reach the parent
        _report(chan, m.StartupError(f"{where}{type(exc).__name__}: {exc}",
                                     traceback.format_exc(), getattr(exc, "kind", "model_load_error")))
        raise SystemExit(1) from None  # a failed rank's exit code says so (distributed/node.py)


def _drop(msg: Any) -> None:
    """A follower rank's scheduler output: rank 0 sends the same."""


def _report(chan: SyncChannel | None, err: m.StartupError) -> None:
    if chan is None:  # a rank on another node: its log is all it has
        import sys

        print(f"{err.message}\n{err.traceback}", file=sys.stderr, flush=True)
        return
    chan.send(err)
    chan.close()


_UNFREEZE_AT_EXIT = False
# NOTE: the scheduler thread hands grammar work to helper threads (grammar/prefetch.py) whose
# native calls release the GIL; when one returns while the scheduler thread runs Python, it
# waits for the GIL up to the switch interval (5 ms by default, a third of a 256-row decode
# step). A shorter interval bounds that handoff wait.
SWITCH_INTERVAL_S = 0.0005


def freeze_startup_objects() -> None:
    """Collect once, then move every live object out of the cyclic collector's generations
    (``gc.freeze``): later full collections scan only what was allocated after startup. They
    are unfrozen at exit, so interpreter teardown still frees them (nanobind, under triton,
    reports frozen instances as leaks)."""
    global _UNFREEZE_AT_EXIT
    gc.collect()
    gc.freeze()
    if not _UNFREEZE_AT_EXIT:
        _UNFREEZE_AT_EXIT = True
        atexit.register(gc.unfreeze)


def _build(config: EngineConfig, send: Any) -> tuple[Any, m.Ready]:
    import torch

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    if config.grammar_backend != "none":  # grammar: the compile workers' zygote imports
        # (seconds of CPU, one core) while the model loads, not after it (engine start-up)
        from ..grammar.compile.worker_handle import prestart_zygote

        prestart_zygote(config.grammar_backend)
    from ..model.runner import ModelRunner
    from .scheduler import Scheduler

    from ..tokenizer.loader import load_tokenizer

    runner = ModelRunner(config)
    eos = _eos_ids(runner)
    tok = load_tokenizer(config, runner.model_dir)  # once: stop strings and the grammar read it
    decode = _decoder(tok)
    grammar = _grammar_manager(config, tok, runner, eos)  # grammar: None when constraints are off
    scheduler = Scheduler(runner, config, eos, decode, send, grammar=grammar)
    if grammar is not None and not grammar.warm():  # grammar: no first-request start-up
        print("sgdsl: the grammar compile workers did not start in time; requests will wait "
              "for them", file=sys.stderr, flush=True)
    ready = m.Ready(model_dir=str(runner.model_dir), context_len=int(runner.context_len),
                    vocab_size=int(runner.model_config.vocab_size),
                    kv_total_slots=int(runner.token_kv_pool.size),
                    max_running_requests=scheduler.max_running, eos_token_ids=tuple(eos))
    return scheduler, ready


def _eos_ids(runner: Any) -> list[int]:
    eos = getattr(runner.model_config, "eos_token_ids", None)
    if eos is None:
        eos = getattr(runner.model_config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple, set, frozenset)) else [int(eos)]


def _decoder(tok: Any):
    """Stop strings are checked here, on the tail of the output; that needs the tokenizer."""
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def _grammar_manager(config: EngineConfig, tok: Any, runner: Any, eos: list[int]) -> Any:
    """Grammar-constrained decoding (runtime/grammar) for this model's tokenizer."""
    if config.grammar_backend == "none":
        return None
    from ..grammar.manager import create_grammar_manager

    return create_grammar_manager(config, tok, int(runner.model_config.vocab_size), eos)


@contextlib.contextmanager
def _profiled(rank: int) -> Iterator[None]:
    """``$SGDSL_PROFILE_DIR``: cProfile the scheduler loop of every rank and write
    ``scheduler-rank{N}.prof`` there when it ends (read with ``python -m pstats``): where a
    step's host time goes, e.g. under tensor parallelism or at large batches."""
    folder = os.environ.get("SGDSL_PROFILE_DIR")
    if not folder:
        yield
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        os.makedirs(folder, exist_ok=True)
        profile.dump_stats(os.path.join(folder, f"scheduler-rank{rank}.prof"))


def _loop(scheduler: Any, chan: SyncChannel | None, parent_pid: int, parallel: bool,
          beat: Any = lambda: None, trace: Any = None) -> None:
    """``chan`` None: a follower rank, which takes rank 0's messages (and waits in that
    broadcast while rank 0 idles). ``trace``: a ``StepTrace`` ($SGDSL_STEP_TRACE) or None."""
    try:
        _iterate(scheduler, chan, parent_pid, parallel, beat, trace)
    finally:
        if trace is not None:
            trace.close()


def _iterate(scheduler: Any, chan: SyncChannel | None, parent_pid: int, parallel: bool,
             beat: Any, trace: Any) -> None:
    from ..distributed.collectives import broadcast_list

    next_check = time.monotonic() + PARENT_CHECK_S
    while True:
        beat()
        if trace is not None:
            trace.begin()
        msgs = chan.recv_all() if chan is not None else None
        if parallel and chan is not None and scheduler.pd is not None:  # pd: rank 0's verdicts
            msgs = [*msgs, *scheduler.pd.outgoing()]
        if parallel:
            msgs = broadcast_list(msgs)
            # NOTE: a second beat once the broadcast returned: an idle follower beats and then
            # waits in that broadcast, so with one beat per iteration it would be as far ahead
            # as a rank 0 stuck on it (distributed/heartbeat.py blames the rank furthest behind).
            beat()
        for msg in msgs:
            if isinstance(msg, m.Shutdown):
                return
            scheduler.handle(msg)
        if trace is not None:
            trace.handled(len(msgs))
        busy = scheduler.step()
        if trace is not None:
            trace.end()
        if not busy and chan is not None:
            chan.wait(IDLE_WAIT_MS)
        now = time.monotonic()
        if now >= next_check:
            next_check = now + PARENT_CHECK_S
            if os.getppid() != parent_pid:
                return  # parent died: we were re-parented

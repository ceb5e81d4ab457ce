"""TokenizerManager: the main-process half of the engine. Runs on the engine's asyncio loop.

It starts the scheduler process and waits for ``Ready``, sends validated requests (see
``request_builder``), routes each ``BatchTokenOut`` to per-request state, serves results and
streams, fans out n > 1 (after caching the shared prompt once), answers RPCs (stats, flush,
integrity) and turns a dead scheduler process into ``EngineDeadError`` for every waiter.
"""
from __future__ import annotations

import asyncio
import functools
import dataclasses
import itertools
import time
import multiprocessing as mp
from typing import Any, AsyncIterator, Callable

from ..config import EngineConfig
from ..distributed import watch
from ..distributed.heartbeat import HangMonitor, Heartbeats
from ..errors import EngineDeadError, ModelLoadError
from ..grammar.schema.validator import OutputValidator
from ..ipc import messages as m
from ..ipc.channel import AsyncChannel, IpcPaths
from .child_process import pid, start_without_main, wait_exit
from .req_state import ReqState
from .request_builder import GenerateSpec

STARTUP_TIMEOUT_S = 600.0
WATCHDOG_S = 1.0


class TokenizerManager:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.paths = IpcPaths.create()
        self.chan = AsyncChannel(self.paths)
        self.proc: Any = None  # rank 0's scheduler process
        self.procs: list[Any] = []  # every rank's process on this node (rank order)
        self.hang: HangMonitor | None = None  # TP: the ranks' loop counters
        self.ready: m.Ready | None = None
        self.tokenizer: Any = None
        self.states: dict[str, ReqState] = {}
        self.children: dict[str, list[str]] = {}  # n > 1: user rid -> child rids
        self.rpcs: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count(1)
        self.dead: EngineDeadError | None = None
        self._tasks: list[asyncio.Task] = []
        self.output_validator = OutputValidator()  # the backstop for json_schema outputs

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> m.Ready:
        from ..distributed import launch

        if self.config.world_size == 1:  # pp: else one process per rank of every stage
            from ..scheduler.process import run_scheduler_process

            ctx = mp.get_context("spawn")
            self.proc = ctx.Process(target=run_scheduler_process, name="sgdsl-scheduler",
                                    daemon=True, args=(self.config, self.paths, pid()))
            start_without_main(self.proc)
            self.procs = [self.proc]
        else:  # one process per tensor-parallel rank of this node
            launch.check_devices(self.config)
            await asyncio.to_thread(launch.check_model, self.config)
            specs = launch.node_ranks(self.config, launch.init_method(self.config))
            beats = Heartbeats(launch.SPAWN, len(specs))
            self.procs = launch.start_ranks(self.config, specs, self.paths, pid(),
                                            start_without_main, beats.counts)
            self.hang = HangMonitor(beats.counts, self.config.rank_hang_timeout_s)
            self.proc = self.procs[0]
        from . import early

        # NOTE: the tokenizer loads while the scheduler starts (early.py), not after Ready;
        # only once the processes are launched: check_model imports transformers on a thread
        # too, and two threads importing transformers at once break its lazy module
        preload = asyncio.ensure_future(asyncio.to_thread(early.load_early, self.config))
        try:
            self.ready = await self._await_ready()
        except BaseException:
            preload.cancel()
            launch.stop_processes(self.procs, 0.0)  # no orphan rank after a failed start
            raise
        self.tokenizer = await self._tokenizer(preload)
        self._tasks = [asyncio.create_task(self._recv_loop()),
                       asyncio.create_task(self._watchdog())]
        return self.ready

    async def _tokenizer(self, preload: asyncio.Future) -> Any:
        """The early tokenizer where it read the folder Ready names, else a load now."""
        from . import early
        from .loader import load_tokenizer

        folder, tokenizer = await preload
        if tokenizer is not None and early.same_folder(
                folder, early.source_of(self.config, self.ready.model_dir)):
            return tokenizer
        return await asyncio.to_thread(load_tokenizer, self.config, self.ready.model_dir)

    async def _await_ready(self) -> m.Ready:
        waited = 0.0
        while waited < STARTUP_TIMEOUT_S:
            msg = await self.chan.recv(timeout_s=0.5)
            waited += 0.5
            if isinstance(msg, m.Ready):
                return msg
            if isinstance(msg, m.StartupError):
                self.proc.join(timeout=10)
                err = ModelLoadError(f"engine startup failed: {msg.message}")
                err.child_traceback = msg.traceback  # type: ignore[attr-defined]
                raise err
            dead = watch.dead_worker(self.procs)
            if msg is None and dead is not None:
                raise EngineDeadError(f"{dead[0]} exited during startup (exit code {dead[1]})")
        raise EngineDeadError(f"scheduler process not ready after {STARTUP_TIMEOUT_S:.0f} s")

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        if any(p.is_alive() for p in self.procs):
            try:
                self.chan.send_nowait(m.Shutdown())  # rank 0 passes it to every rank
            except Exception:  # noqa: BLE001 - the socket may already be gone
                pass
            for proc in self.procs:
                await wait_exit(proc, 10.0)
            for proc in self.procs:
                if proc.is_alive():
                    proc.kill()
                    await wait_exit(proc, 5.0)
        self._fail_all(EngineDeadError("engine shut down"))
        self.chan.close()
        self.paths.cleanup()

    # -- receiving ------------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        while True:
            msg = await self.chan.recv()
            if isinstance(msg, m.BatchTokenOut):
                hops = (msg.sent_at, time.time()) if msg.sent_at is not None else None  # hops:
                for out in msg.outs:
                    state = self.states.get(out.rid)
                    if state is not None:
                        state.apply(out)
                        if hops is not None:  # hops: the oldest step not yet in a chunk
                            state.hop_steps += 1
                            state.hops = state.hops or hops
                        if state.finish_reason is not None:
                            del self.states[out.rid]
            elif isinstance(msg, m.RpcResp):
                fut = self.rpcs.pop(msg.call_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, m.StartupError):
                self._die(await self._crash_text(msg))
                return

    async def _watchdog(self) -> None:
        if self.hang is not None:
            self.hang = HangMonitor(self.hang.counts, self.hang.timeout_s)  # from Ready on
        while (dead := watch.dead_worker(self.procs)) is None:
            hung = self.hang.hung() if self.hang is not None else None
            if hung is not None:
                self._die(watch.hung_text(hung, self.hang.timeout_s))
                break
            await asyncio.sleep(WATCHDOG_S)
        else:
            await asyncio.sleep(0.2)  # let a crash report sent just before exit arrive first
            dead = watch.dead_worker(self.procs) or dead  # the others may have exited since
            self._die(f"{dead[0]} exited unexpectedly (exit code {dead[1]})")
        watch.kill_all(self.procs)
        for proc in self.procs:
            await wait_exit(proc, 5.0)

    async def _crash_text(self, msg: m.StartupError) -> str:
        if len(self.procs) > 1:
            await asyncio.sleep(2 * WATCHDOG_S)  # a killed rank is reaped by then
        return watch.crash_text(self.procs, f"{msg.message}\n{msg.traceback}")

    def _die(self, text: str) -> None:
        if self.dead is None:
            self.dead = EngineDeadError(text)
        self._fail_all(self.dead)

    def _fail_all(self, err: BaseException) -> None:
        for state in self.states.values():
            state.fail(err)
        self.states.clear()
        for fut in self.rpcs.values():
            if not fut.done():
                fut.set_exception(err)
        self.rpcs.clear()

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(str(self.dead))

    # -- requests -------------------------------------------------------------------------------
    def _track(self, req: m.TokenizedGenerateReq, spec: GenerateSpec, stream: bool) -> ReqState:
        state = ReqState(req.rid, req.sampling_params, self.tokenizer, req.return_logprob,
                         spec.return_text_in_logprobs, stream, validator=self.output_validator)
        self.states[req.rid] = state
        return state

    def _send_req(self, req: m.TokenizedGenerateReq, spec: GenerateSpec, stream: bool) -> ReqState:
        state = self._track(req, spec, stream)
        self.chan.send_nowait(req)
        return state

    async def _warm_prefix(self, spec: GenerateSpec) -> None:
        """n > 1: prefill the shared prompt once so every sample reuses its cached KV."""
        first = spec.reqs[0]
        warm = m.TokenizedGenerateReq(f"{spec.rid}-prefix", first.input_ids,
                                      first.sampling_params.replace(max_new_tokens=0, min_new_tokens=0),
                                      mm=first.mm)  # mm: the same images
        state = self._send_req(warm, spec, stream=False)
        await state.done.wait()

    async def generate(self, specs: list[GenerateSpec], raise_errors: bool = True) -> list[dict]:
        """Results of every request of every spec, prompt-major.

        ``raise_errors`` False (a batch call): a request that failed (its grammar did not
        compile, its output broke the schema) takes its place as a dict whose
        ``finish_reason`` is ``{"type": "abort", "message", "status_code", "err_type"}``, as
        SGLang reports it, so one failure never discards the other outputs; a dead engine
        still raises. True (one request): its error is raised, typed."""
        self._check_alive()
        for spec in specs:
            if len(spec.reqs) > 1:
                self.children[spec.rid] = [r.rid for r in spec.reqs]
        try:
            warm = [s for s in specs if len(s.reqs) > 1 and not self.config.disable_radix_cache]
            if warm:
                await asyncio.gather(*(self._warm_prefix(s) for s in warm))
            states = [self._track(r, s, False) for s in specs for r in s.reqs]
            for state in states:  # each answer built when its request finishes (see _keep)
                state.on_done = _keep
            # NOTE: the call's requests go as one message, so the scheduler admits them in one
            # step as the in-process scheduler does (one message each let it start on the
            # first few while the rest were in flight: more prefill batches, a staggered
            # decode), and requests that share a SamplingParams pickle it once.
            reqs = [r for s in specs for r in s.reqs]
            self.chan.send_nowait(reqs if len(reqs) > 1 else reqs[0])
            await asyncio.gather(*(st.done.wait() for st in states))
        except asyncio.CancelledError:  # the caller went away: free the scheduler's work
            for spec in specs:
                self.abort(spec.rid, "request cancelled by the caller")
            raise
        finally:
            for spec in specs:
                self.children.pop(spec.rid, None)
        failed = [st.error for st in states if st.error is not None]
        dead = next((e for e in failed if isinstance(e, EngineDeadError)), None)
        if dead is not None or (failed and raise_errors):
            raise dead or failed[0]
        return [st.kept if st.kept is not None else st.result() for st in states]

    def submit(self, specs: list[GenerateSpec], settle: Callable[[int, Any], None]) -> None:
        """Single requests (one prompt, n = 1 each; runtime/submitter.py gathers them) in one
        message; ``settle(i, outcome)`` runs on this loop as soon as request i finishes, with
        its result dict or its error (each on its own: a failed request fails only itself)."""
        states = []
        for i, spec in enumerate(specs):
            state = self._track(spec.reqs[0], spec, False)
            state.on_done = functools.partial(_settle, settle, i)
            states.append(state)
        try:
            self._check_alive()
            reqs = [s.reqs[0] for s in specs]
            self.chan.send_nowait(reqs if len(reqs) > 1 else reqs[0])
        except BaseException as exc:  # noqa: BLE001 - a dead engine fails these, not the loop
            for state in states:
                self.states.pop(state.rid, None)
                state.fail(exc)

    async def stream(self, spec: GenerateSpec) -> AsyncIterator[dict]:
        self._check_alive()
        req = dataclasses.replace(spec.reqs[0], stream=True)
        state = self._send_req(req, spec, stream=True)
        try:
            while True:
                await state.updated.wait()
                state.updated.clear()
                if state.error is not None:
                    raise state.error
                chunk = state.stream_chunk()
                if chunk is not None:
                    yield chunk
                if state.finish_reason is not None:
                    return
        finally:
            if state.finish_reason is None and state.error is None:
                self.abort(spec.rid, "stream closed by the caller")

    def abort(self, rid: str, message: str = "aborted by request") -> None:
        if self.dead is not None:
            return
        for child in self.children.get(rid, [rid]):
            if child in self.states:
                self.chan.send_nowait(m.AbortReq(child, message))

    async def rpc(self, kind: type, **fields: Any) -> m.RpcResp:
        """Send ``kind(call_id, **fields)`` to the scheduler; its ``RpcResp``."""
        self._check_alive()
        call_id = next(self._call_ids)
        fut = asyncio.get_running_loop().create_future()
        self.rpcs[call_id] = fut
        self.chan.send_nowait(kind(call_id, **fields))
        return await fut


def _keep(state: ReqState) -> None:
    """A list call's request finished: its answer is built now, while the others decode, not
    after the last one (issue 29: a batch's answers were all built at its end, on the path
    the caller waits for). Errors are reported at the end, as before."""
    if state.error is None:
        try:
            state.kept = state.result()
        except Exception:  # noqa: BLE001 - built again (and raised) where it is returned
            state.kept = None


def _settle(settle: Callable[[int, Any], None], index: int, state: ReqState) -> None:
    # NOTE: runs inside the receive loop (ReqState.apply): whatever goes wrong building this
    # one result is this request's error, never the loop's.
    try:
        outcome = state.error if state.error is not None else state.result()
    except Exception as exc:  # noqa: BLE001 - delivered to the waiting caller
        outcome = exc
    settle(index, outcome)

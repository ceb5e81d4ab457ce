"""Engine: the in-process facade of the runtime (contract: docs/engine_api.md).

The engine owns an asyncio loop in a daemon thread, where its TokenizerManager lives. Sync
methods submit coroutines to that loop and wait; async methods bridge the result to the caller's
loop, so one engine serves any thread and any loop (server, notebooks, the Local backend).
Input is validated in the caller's thread, so bad input raises before anything is sent.
"""
from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import os
import queue
import threading
import weakref
from typing import Any, AsyncIterator, Callable, Iterator

from .config import EngineConfig
from .errors import EngineDeadError
from .ipc import messages as m
from .mailbox import Mailboxes
from .quiet_tqdm import import_tqdm_auto_quietly
from .scheduler.process import freeze_startup_objects
from .submitter import HandoffLimits, Submitter
from .tokenizer.check_pool import CheckPool, copy_outcome
from .tokenizer.manager import TokenizerManager
from .tokenizer.request_builder import GenerateSpec, RequestBuilder

_END = object()


class Engine:
    def __init__(self, model: str | os.PathLike | EngineConfig | None = None, **kwargs: Any) -> None:
        if isinstance(model, EngineConfig):
            config = model.replace(**kwargs) if kwargs else model
        else:
            config = EngineConfig.from_kwargs(model=None if model is None else str(model), **kwargs)
        self.config = config
        import_tqdm_auto_quietly()  # before transformers: no TqdmWarning in a notebook cell
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._mailboxes = Mailboxes(self._loop)
        self._submitters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per loop
        self._submitters_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sgdsl-engine",
                                        daemon=True)
        self._thread.start()
        self._tm: TokenizerManager = self._call(_make_manager(config))
        try:
            self._ready: m.Ready = self._call(self._tm.start())
        except BaseException:
            self._stop_loop_after(self._tm.shutdown())
            raise
        self.tokenizer = self._tm.tokenizer
        from .multimodal.processor import MultimodalProcessor  # mm: None for text-only models

        self.mm_processor = MultimodalProcessor.for_model(self._ready.model_dir, self.tokenizer,
                                                          config)
        self._builder = RequestBuilder(self.tokenizer, self._ready, self.mm_processor)
        # new schemas' checks, off callers' loops; as many may wait as compiles may (each check
        # precedes its compile: a burst the compile queue admits must pass the checks too)
        self._checks = CheckPool(self._builder, max_queued=config.grammar_compile_queue)
        self._checking: dict[str, bool] = {}  # rid waiting for its check -> aborted meanwhile
        self._eager_handoff = _accelerated(config)  # at start-up, not on a first request
        atexit.register(self.shutdown)
        if not config.disable_gc_freeze:
            freeze_startup_objects()  # NOTE: this process holds torch and the tokenizer too

    # -- plumbing -------------------------------------------------------------------------------
    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineDeadError("the engine was shut down")

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- info -----------------------------------------------------------------------------------
    @property
    def model_info(self) -> dict:
        r = self._ready
        return {"model_path": r.model_dir,
                "served_model_name": self.config.served_model_name or self.config.model or
                "SmolLM2-135M-Instruct",
                "context_length": r.context_len, "vocab_size": r.vocab_size,
                "eos_token_ids": list(r.eos_token_ids),
                "chat_template": getattr(self.tokenizer, "chat_template", None),
                "is_generation": True,
                # mm: how a prompt marks an image (None: a text-only model), images per request
                "image_placeholder": mm.fmt.placeholder if (mm := self.mm_processor) else None,
                "max_images_per_request": mm.max_images if mm else 0}

    def stats(self) -> dict:
        self._check_open()
        stats = dict(self._call(self._tm.rpc(m.StatsReq)).value)
        with self._submitters_lock:  # single requests coalesced per caller loop turn
            subs = list(self._submitters.values())
        stats["submit_handoffs"] = sum(s.handoffs for s in subs)
        stats["submit_requests"] = sum(s.requests for s in subs)
        stats["offloop_schema_checks"] = self._checks.checks  # new schemas checked off loops
        stats["offloop_schema_checks_rejected"] = self._checks.rejected  # their queue was full
        if self.mm_processor is not None:  # mm: image preprocessing in this process
            stats.update(self.mm_processor.stats())
        return stats

    def server_info(self) -> dict:
        import dataclasses

        return {**dataclasses.asdict(self.config), **self.stats()}

    # -- generation -------------------------------------------------------------------------------
    def _build(self, prompt: Any, sampling_params: Any, input_ids: Any, return_logprob: Any,
               logprob_start_len: Any, top_logprobs_num: Any, return_text_in_logprobs: bool,
               stream: bool, rid: Any, image_data: Any = None) -> tuple[list[GenerateSpec], bool]:
        self._check_open()
        specs, batched = self._builder.build(prompt, sampling_params, input_ids, return_logprob,
                                             logprob_start_len, top_logprobs_num,
                                             return_text_in_logprobs, rid, image_data)
        if stream and _many(specs, batched):
            from .errors import InvalidRequestError

            raise InvalidRequestError("stream=True takes a single prompt with n=1", field="stream")
        return specs, batched

    @staticmethod
    def _shape(results: list[dict], specs: list[GenerateSpec], batched: bool) -> Any:
        return results if _many(specs, batched) else results[0]

    def generate(self, prompt: str | list[str] | None = None, sampling_params: Any = None,
                 input_ids: list[int] | list[list[int]] | None = None,
                 return_logprob: bool | list[bool] = False,
                 logprob_start_len: int | list[int] = -1, top_logprobs_num: int | list[int] = 0,
                 return_text_in_logprobs: bool = False, stream: bool = False,
                 rid: str | list[str] | None = None, image_data: Any = None) -> Any:
        """``image_data`` (mm): a prompt's images (bytes, paths, data: URLs, PIL images; one
        or a list; per prompt for a batch), each marked in the prompt by the model's image
        placeholder (or all prepended when it has none)."""
        specs, batched = self._build(prompt, sampling_params, input_ids, return_logprob,
                                     logprob_start_len, top_logprobs_num,
                                     return_text_in_logprobs, stream, rid, image_data)
        if stream:
            return self._sync_stream(specs[0])
        many = _many(specs, batched)
        return self._shape(self._call(self._tm.generate(specs, not many)), specs, batched)

    async def async_generate(self, prompt: str | list[str] | None = None,
                             sampling_params: Any = None,
                             input_ids: list[int] | list[list[int]] | None = None,
                             return_logprob: bool | list[bool] = False,
                             logprob_start_len: int | list[int] = -1,
                             top_logprobs_num: int | list[int] = 0,
                             return_text_in_logprobs: bool = False, stream: bool = False,
                             rid: str | list[str] | None = None, image_data: Any = None) -> Any:
        args = (prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                top_logprobs_num, return_text_in_logprobs, stream, rid, image_data)
        if image_data is not None:  # mm: decoding/processing images must not block the loop
            # NOTE: the default executor, not the processor's pool, which _build itself uses
            # pd: in this context (its bootstrap scope, disaggregation/bootstrap.py)
            specs, batched = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(contextvars.copy_context().run, self._build, *args))
        else:
            self._check_open()
            checking = self._checks.waiting(sampling_params)
            if checking is not None:  # a new schema: checked off this loop (check_pool.py)
                await asyncio.shield(checking)
            specs, batched = self._build(*args)
        if stream:
            return self._async_stream(specs[0])
        return await self._start(specs, batched)

    def generate_nowait(self, prompt: str | list[str] | None = None,
                        sampling_params: Any = None,
                        input_ids: list[int] | list[list[int]] | None = None,
                        return_logprob: bool | list[bool] = False,
                        logprob_start_len: int | list[int] = -1,
                        top_logprobs_num: int | list[int] = 0,
                        return_text_in_logprobs: bool = False,
                        rid: str | list[str] | None = None) -> asyncio.Future:
        """``async_generate`` (not streamed, no images) started now, on the running loop: the
        request is built and validated in this call (bad input raises here, nothing is sent)
        and a single request joins this loop turn's hand-off (submitter.py). Returns a future
        of what ``async_generate`` returns; cancelling it aborts the request. A server calls
        this from the handler step that parsed the request, so a burst read in one poll of
        its sockets is in the same hand-off (``await async_generate`` submits a turn later).
        A JSON schema not checked before is checked off the loop first (check_pool.py): then
        its error, if any, is the returned future's."""
        args = (prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                top_logprobs_num, return_text_in_logprobs, False, rid)
        self._check_open()
        checking = self._checks.waiting(sampling_params)
        if checking is not None:
            return self._start_after(checking, args)
        return self._start(*self._build(*args))

    def _start_after(self, checking: asyncio.Future, args: tuple) -> asyncio.Future:
        """``_start`` of the request built from ``args`` once ``checking`` is done, on the
        running loop; cancelling the returned future before then sends nothing."""
        outer = asyncio.get_running_loop().create_future()
        rid = args[-1] if isinstance(args[-1], str) else None
        if rid is not None:  # abort(rid) meanwhile is remembered, not lost (see abort)
            self._checking[rid] = False

        def go(done: asyncio.Future) -> None:  # NOTE: in this call's context (pd: bootstrap)
            aborted = self._checking.pop(rid, False) if rid is not None else False
            if outer.done():  # the caller went away during the check: nothing was sent
                return
            try:
                if done.cancelled():  # the pool stopped: the engine shut down
                    raise EngineDeadError("the engine was shut down")
                if done.exception() is not None:
                    raise done.exception()  # type: ignore[misc]
                specs, batched = self._build(*args)
                inner = (self._start_aborted(specs, batched) if aborted
                         else self._start(specs, batched))
            except BaseException as exc:  # noqa: BLE001 - the request's own error
                outer.set_exception(exc)
                return
            inner.add_done_callback(functools.partial(copy_outcome, outer))
            outer.add_done_callback(lambda f: f.cancelled() and inner.cancel())
        checking.add_done_callback(go)
        return outer

    def hold_handoff(self) -> Callable[[], None]:
        """Keep the running loop's next hand-off of single requests until the returned
        ``release()`` is called (once, on that loop): for requests about to be submitted (a
        burst's prompts being encoded off the loop), so they travel with those waiting."""
        return self._submitter(asyncio.get_running_loop()).hold()

    def note_intake(self) -> None:
        """The running loop is taking work in (a server accepted a connection or read request
        bytes): its next hand-off check looks again for the requests to come (submitter.py)."""
        self._submitter(asyncio.get_running_loop()).touch()

    def _start(self, specs: list[GenerateSpec], batched: bool) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        many = _many(specs, batched)
        if many or self.config.disable_request_coalescing:
            return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                self._generate(specs, many), self._loop), loop=loop)
        rid = specs[0].rid
        future = self._submitter(loop).submit(specs[0])  # travels with this loop turn's others
        # the caller went away: free the scheduler's work (a no-op if it was never sent)
        future.add_done_callback(lambda f: f.cancelled() and self.abort(rid))
        return future

    def _start_aborted(self, specs: list[GenerateSpec], batched: bool) -> asyncio.Future:
        """``_start`` of requests aborted while their schema was checked: sent, then aborted
        once the tokenizer manager knows them, so the caller gets an abort's usual answer."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            self._generate_aborted(specs, _many(specs, batched)), self._loop),
            loop=asyncio.get_running_loop())

    async def _generate_aborted(self, specs: list[GenerateSpec], many: bool) -> Any:
        task = asyncio.ensure_future(self._generate(specs, many))
        rids = [r.rid for s in specs for r in s.reqs]
        while not task.done() and any(rid not in self._tm.states for rid in rids):
            await asyncio.sleep(0.001)  # NOTE: n > 1 warms the shared prefix before sending
        for spec in specs:
            self._tm.abort(spec.rid)
        return await task

    async def _generate(self, specs: list[GenerateSpec], many: bool) -> Any:
        results = await self._tm.generate(specs, not many)
        return results if many else results[0]

    def _submitter(self, loop: asyncio.AbstractEventLoop) -> Submitter:
        submitter = self._submitters.get(loop)
        if submitter is None:  # once per caller loop
            with self._submitters_lock:  # stats() may be listing them from another thread
                limits = HandoffLimits(self.config.chunked_prefill_size,
                                       self.config.max_running_requests,
                                       eager=self._eager_handoff)
                submitter = self._submitters.setdefault(loop, Submitter(
                    loop, self._loop, self._tm.submit, self._mailboxes.of(loop), limits))
        return submitter

    def _sync_stream(self, spec: GenerateSpec) -> Iterator[dict]:
        q: queue.Queue = queue.Queue()
        fut = asyncio.run_coroutine_threadsafe(_pump(self._tm.stream(spec), q.put), self._loop)
        try:
            while (item := q.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not fut.done():  # the caller stopped iterating early
                self.abort(spec.rid)

    async def _async_stream(self, spec: GenerateSpec) -> AsyncIterator[dict]:
        q: asyncio.Queue = asyncio.Queue()
        box = self._mailboxes.of(asyncio.get_running_loop())  # streams share the wake-ups
        put = functools.partial(box.put, q)
        fut = asyncio.run_coroutine_threadsafe(_pump(self._tm.stream(spec), put), self._loop)
        try:
            while (item := await q.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not fut.done():
                self.abort(spec.rid)

    # -- control -------------------------------------------------------------------------------------
    def abort(self, rid: str) -> None:
        if rid in self._checking:  # its schema is being checked: aborted once it is sent
            self._checking[rid] = True
        if not self._closed:
            self._loop.call_soon_threadsafe(self._tm.abort, rid)

    def flush_cache(self) -> bool:
        self._check_open()
        return bool(self._call(self._tm.rpc(m.FlushCacheReq)).value)

    def precompile(self, constraints: list[dict[str, Any]],
                   timeout: float | None = None) -> list[dict[str, Any]]:
        """Compile grammar constraints ahead of requests, so their first requests do not wait
        (warm-up after a start; with the on-disk cache, one engine's compiles serve the
        others). Each constraint is a dict of the ``sampling_params`` constraint fields
        (``{"json_schema": ...}``, ``{"regex": ...}`` or ``{"ebnf": ...}``). Returns one
        result per constraint, in order: ``{"ok": True, "kind": ...}``, or ``{"ok": False,
        "kind", "error", "field", "status"}`` with the error a request with it would get.
        Blocks until every one is decided (``timeout``: at most that many seconds)."""
        from .grammar.compile.precompile import parse_constraints

        self._check_open()
        parsed, results = parse_constraints(constraints)
        if parsed:
            resp = self._call(self._tm.rpc(m.PrecompileReq, constraints=tuple(
                c for _, c in parsed)), timeout)
            for (index, _), result in zip(parsed, resp.value):
                results[index] = result
        return results

    def check_idle_integrity(self) -> None:
        """Raise AssertionError unless the scheduler is idle with no KV leaked or locked."""
        self._check_open()
        resp = self._call(self._tm.rpc(m.CheckIntegrityReq))
        if not resp.ok:
            raise AssertionError(f"engine idle invariant broken: {resp.error}")

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        self._checks.shutdown()
        self._stop_loop_after(self._tm.shutdown())

    def _stop_loop_after(self, coro: Any) -> None:
        try:
            self._call(coro, timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


def _accelerated(config: EngineConfig) -> bool:
    """Whether the scheduler's forwards run on an accelerator (submitter.py's eager hand-off)."""
    if config.device != "auto":
        return config.device != "cpu"
    import torch  # NOTE: already imported with this module's scheduler imports

    return bool(torch.cuda.is_available())


def _many(specs: list[GenerateSpec], batched: bool) -> bool:
    """Whether a call returns a list (a batch, or n > 1): then a failed request is reported in
    its own dict (finish_reason abort) instead of raised, so the others are not lost."""
    return batched or len(specs[0].reqs) > 1


async def _make_manager(config: EngineConfig) -> TokenizerManager:
    return TokenizerManager(config)  # created on the engine loop: its sockets belong to it


async def _pump(agen: AsyncIterator[dict], put: Any) -> None:
    try:
        async for item in agen:
            put(item)
    except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer's thread
        put(exc)
    finally:
        put(_END)

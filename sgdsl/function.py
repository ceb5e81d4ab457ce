"""``SglFunction``: a program (a Python function whose first parameter is the state ``s``)
and the ways to run it: ``run``/``run_batch`` (sync), ``arun``/``arun_batch`` (async),
``bind``, ``trace``, ``cache``."""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
from functools import partial
from typing import Any, Callable, Collection, Iterator

from sgdsl import ir
from sgdsl.backends.burst import burst_gate
from sgdsl.interpreter.executor import StateExecutor
from sgdsl.interpreter.program_run import ProgramRun
from sgdsl.interpreter.batch import Batch
from sgdsl.interpreter.loop import background_loop, body_runner, run_sync, threadsafe_future
from sgdsl.state import ProgramState

_PARAM_NAMES = {f.name for f in dataclasses.fields(ir.SamplingParams)}
_ALIASES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
_RESERVED = ("stream", "backend", "use_thread")


class SglFunction:
    def __init__(self, func: Callable[..., Any], num_api_spec_tokens: int | None = None,
                 bind_arguments: dict[str, Any] | None = None) -> None:
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.arg_names = list(inspect.signature(func).parameters)[1:]
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Inside another program, ``f(s, ...)`` runs the body on that state; elsewhere
        ``f(...)`` is ``f.run(...)`` (as in SGLang)."""
        if args and _is_state(args[0]):
            return self.func(*args, **{**self.bind_arguments, **kwargs})
        return self.run(*args, **kwargs)

    def bind(self, **kwargs: Any) -> "SglFunction":
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    # ---- sync ---------------------------------------------------------------------------

    def run(self, *args: Any, stream: bool = False, backend: Any = None, **kwargs: Any) -> ProgramState:
        """Run once. Sampling keywords (``temperature``, ``max_new_tokens``...) are program-wide
        defaults for every gen; other keywords are the program's arguments. Without ``stream``
        the call returns when the program is done and raises its error, if any; with it, returns
        at once (iterate ``text_iter()``)."""
        kwargs.pop("use_thread", None)
        defaults, kwargs = split_sampling_kwargs(kwargs, self.arg_names)
        state = self._new_state(backend, defaults, stream, background_loop())
        if stream:
            body_runner().submit(partial(self._body, state, args, kwargs))
            return state
        try:
            self._body(state, args, kwargs, raise_errors=True)
            state.sync()
        except KeyboardInterrupt:
            state.cancel()  # abort the in-flight backend requests too
            raise
        state.stream_executor.raise_if_failed()
        return state

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  generator_style: bool = False, max_concurrency: int | None = None,
                  **sampling: Any) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program on each kwargs dict concurrently; states come back in input order
        (as an iterator with ``generator_style``). A failed program does not stop the batch:
        its state's ``error()`` holds the exception."""
        limit = max_concurrency or (None if num_threads == "auto" else int(num_threads))
        bar = _progress(len(batch_kwargs)) if progress_bar else None
        batch = self._batch(batch_kwargs, backend, sampling, limit, background_loop(),
                            None if bar is None else bar.update)
        try:
            body_runner().run_here(batch.start)  # NOTE: this thread runs bodies until it waits
        except BaseException:
            batch.cancel()
            raise

        def results() -> Iterator[ProgramState]:
            try:
                for i in range(len(batch)):
                    yield batch.wait(i)
            except BaseException:
                batch.cancel()
                raise
            if bar is not None:
                bar.close()
        return results() if generator_style else list(results())

    # ---- async --------------------------------------------------------------------------

    async def arun(self, *args: Any, backend: Any = None, stream: bool = False, **kwargs: Any) -> ProgramState:
        """Run on the current event loop. Cancelling the awaiting task aborts the program's
        in-flight backend requests. Raises the program's error, if any. With ``stream`` returns
        at once; read it with ``text_async_iter`` (``state.cancel()`` aborts it)."""
        defaults, kwargs = split_sampling_kwargs(kwargs, self.arg_names)
        state = self._new_state(backend, defaults, stream, asyncio.get_running_loop())
        if stream:
            body_runner().submit(partial(self._body, state, args, kwargs))
            return state
        done, resolve = threadsafe_future(asyncio.get_running_loop())
        state.stream_executor.run.when_done(resolve)
        body_runner().submit(partial(self._body, state, args, kwargs))
        try:
            await done
        except asyncio.CancelledError:
            state.cancel()
            raise
        state.stream_executor.raise_if_failed()
        return state

    async def arun_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Any = None,
                         max_concurrency: int | None = None, **sampling: Any) -> list[ProgramState]:
        """``run_batch`` for async code: at most ``max_concurrency`` programs at a time."""
        batch = self._batch(batch_kwargs, backend, sampling, max_concurrency,
                            asyncio.get_running_loop())
        batch.start()
        return await batch.wait_all()

    def _batch(self, batch_kwargs: list[dict[str, Any]], backend: Any, sampling: dict[str, Any],
               limit: int | None, loop: asyncio.AbstractEventLoop,
               on_finish: Callable[[], Any] | None = None) -> Batch:
        """A batch (not started): one backend and template for all, bodies on the body runner."""
        from sgdsl.config import resolve_backend  # noqa: PLC0415

        defaults, _ = split_sampling_kwargs(sampling)
        resolved = resolve_backend(backend)
        template = _template_of(resolved)
        runner = body_runner()

        def make_state(_: Any) -> ProgramState:
            run = ProgramRun(resolved, loop, template, defaults, False, self.num_api_spec_tokens)
            return ProgramState(StateExecutor(run))
        return Batch(batch_kwargs, make_state,
                     lambda state, kwargs: runner.submit(partial(self._body, state, (), kwargs)),
                     limit, on_finish, (runner, loop, burst_gate(loop)))

    # ---- helpers ------------------------------------------------------------------------

    def _new_state(self, backend: Any, defaults: ir.SamplingParams, stream: bool,
                   loop: asyncio.AbstractEventLoop) -> ProgramState:
        from sgdsl.config import resolve_backend  # noqa: PLC0415

        backend = resolve_backend(backend)
        run = ProgramRun(backend, loop, _template_of(backend), defaults, stream, self.num_api_spec_tokens)
        return ProgramState(StateExecutor(run))

    def _body(self, state: ProgramState, args: tuple, kwargs: dict[str, Any],
              raise_errors: bool = False) -> None:
        ex = state.stream_executor
        try:
            state.ret_value = self.func(state, *args, **{**self.bind_arguments, **kwargs})
        except BaseException as exc:  # noqa: BLE001 - kept on the state, re-raised below if asked
            if ex.error_ is None:
                ex.error_ = exc
                ex.signal.notify()
            if raise_errors or isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            ex.end()
            ex.run.end_body()

    def trace(self, *, backend: Any = None, **kwargs: Any) -> Any:
        """The program's IR as far as it can be known without running it (see sgdsl.tracer)."""
        from sgdsl.tracer import trace_program  # noqa: PLC0415

        return trace_program(self, kwargs)

    def cache(self, backend: Any = None) -> str:
        """Warm the backend's prefix cache with the program's constant prefix; returns it."""
        return run_sync(self.acache(backend))

    async def acache(self, backend: Any = None) -> str:
        from sgdsl.backends.base import Context  # noqa: PLC0415
        from sgdsl.config import resolve_backend  # noqa: PLC0415
        from sgdsl.tracer import extract_prefix  # noqa: PLC0415

        backend = resolve_backend(backend)
        prefix = extract_prefix(self, backend)
        if prefix:
            await backend.cache_prefix(Context(text=prefix))
        return prefix


def split_sampling_kwargs(kwargs: dict[str, Any], program_args: Collection[str] = ()
                          ) -> tuple[ir.SamplingParams, dict[str, Any]]:
    """Program-wide sampling defaults vs. program arguments. A keyword the program itself
    declares (e.g. a parameter named ``max_tokens``) is always the program's argument."""
    values, rest = {}, {}
    for key, value in kwargs.items():
        field = _ALIASES.get(key, key)
        if field in _PARAM_NAMES and key not in _RESERVED and key not in program_args:
            if value is not None:
                values[field] = tuple([value] if isinstance(value, (str, int)) else value) \
                    if field in ("stop", "stop_token_ids", "stop_regex") else value
        else:
            rest[key] = value
    return ir.SamplingParams(**values), rest


def _is_state(value: Any) -> bool:
    from sgdsl.tracer import TracerState  # noqa: PLC0415

    return isinstance(value, (ProgramState, TracerState))


def _template_of(backend: Any) -> Any:
    from sgdsl.chat_template import get_chat_template  # noqa: PLC0415

    return backend.chat_template() or get_chat_template("default")


def _progress(total: int) -> Any:
    from sgdsl.notebook.progress import progress_bar  # noqa: PLC0415

    return progress_bar(total)

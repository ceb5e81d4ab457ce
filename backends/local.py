"""``Local``: programs run on the bundled runtime's ``Engine`` in this process (the default
backend: ``Local()`` loads the embedded SmolLM2 model). torch is imported only when a ``Local``
is constructed, never by ``import sgdsl.backends``."""
from __future__ import annotations

import asyncio
import functools
from typing import Any, AsyncIterator

from sgdsl.runtime.errors import error_of

from ._common import backend_error
from .coalescer import Coalescer, batchable
from .loop_local import LoopLocal
from .srt import SrtBackend

_ARG_KEYS = ("input_ids", "sampling_params", "return_logprob", "logprob_start_len",
             "top_logprobs_num", "return_text_in_logprobs", "stream", "rid", "image_data")


class Local(SrtBackend):
    """The runtime Engine in-process. ``Local(model=None, **engine_options)`` starts an Engine
    (``model=None`` = the embedded model); ``Local(engine=e)`` shares an existing one, which
    ``close()`` then leaves running."""

    name = "Local"

    def __init__(self, model: str | None = None, *, engine: Any = None,
                 **engine_options: Any) -> None:
        if engine is None:
            from sgdsl.runtime import Engine

            engine = Engine(model=model, **engine_options)
            self._owns_engine = True
        else:
            if model is not None or engine_options:
                raise TypeError("pass either engine= or model/engine options, not both")
            self._owns_engine = False
        self.engine = engine
        self._encode = _burst_encoder(engine)
        self._coalescers = LoopLocal(lambda: Coalescer(
            functools.partial(self._call_engine, per_request_errors=True), self._failed,
            self._each if self._encode is not None else None))
        self._init_capabilities()

    @property
    def model_info(self) -> dict[str, Any]:
        return dict(self.engine.model_info)

    def server_info(self) -> dict[str, Any]:
        return dict(self.engine.server_info())

    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    async def _call(self, request: dict[str, Any]) -> dict | list[dict]:
        if batchable(request):
            return await self._coalescers.get().submit(request)
        return await self._call_engine(request)

    def _each(self, requests: list[dict[str, Any]]) -> list[asyncio.Task] | None:
        """A burst (``run_batch``'s programs) as single Engine calls started in one loop turn,
        their text prompts tokenized in one tokenizer call (the one the Engine makes for a
        list: in parallel, without the GIL): the Engine's submitter hands calls of one turn to
        the scheduler in one message, as it does a list call, and each program gets its result
        when its own request finishes. (A list call answers when the slowest request does, so
        the interpreter handled the whole batch's results after the last token: ~40 ms of a
        256-program batch on the dev box, with nothing else running.) None: a prompt that does
        not tokenize; the list call then reports it as the Engine does."""
        try:
            ids = self._encode([r["text"] for r in requests])
        except Exception:  # noqa: BLE001 - the list call reports it
            return None
        if not all(ids):
            return None
        loop = asyncio.get_running_loop()
        return [loop.create_task(self._call_engine(_with_ids(r, i))) for r, i in zip(requests, ids)]

    async def _call_engine(self, request: dict[str, Any],
                           per_request_errors: bool = False) -> dict | list[dict]:
        try:
            out = await self.engine.async_generate(**_engine_args(request))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise backend_error(self.name, exc) from exc
        if isinstance(out, list) and not per_request_errors:
            # a list call (n > 1) reports a failed request in its own dict; this call is one
            # request of Local's, which raises its error (only the coalescer's batches split)
            err = next((e for e in map(self._failed, out) if e is not None), None)
            if err is not None:
                raise err
        return out

    def _failed(self, out: dict[str, Any]) -> BaseException | None:
        """The BackendError for an output whose finish_reason carries a runtime error."""
        cause = error_of((out.get("meta_info") or {}).get("finish_reason"))
        return None if cause is None else backend_error(self.name, cause)  # chained to cause

    async def _call_stream(self, request: dict[str, Any]) -> AsyncIterator[dict]:
        try:
            chunks = await self.engine.async_generate(**_engine_args(request))
            async for chunk in chunks:
                yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            raise backend_error(self.name, exc) from exc

    async def _abort(self, rid: str) -> None:
        try:
            self.engine.abort(rid)
        except Exception:  # noqa: BLE001 - an abort of a finished request is not an error
            pass

    async def close(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()

    def shutdown(self) -> None:
        """Synchronous ``close`` (SGLang's ``Runtime.shutdown`` spelling)."""
        if self._owns_engine:
            self.engine.shutdown()


def _burst_encoder(engine: Any) -> Any:
    """The tokenizer call the Engine's request builder makes for a list of text prompts (the
    very ids it would make), for ``Local._each``; None for an engine without a tokenizer, with
    an image processor (its prompts may mark images: they go as text), or whose single calls
    are not gathered (``disable_request_coalescing``: a burst goes as one list call)."""
    tokenizer = getattr(engine, "tokenizer", None)
    config = getattr(engine, "config", None)
    if (tokenizer is None or getattr(engine, "mm_processor", None) is not None
            or config is None or getattr(config, "disable_request_coalescing", True)):
        return None
    from sgdsl.runtime.tokenizer.encoder import ids_batch_encoder

    return ids_batch_encoder(tokenizer)


def _with_ids(request: dict[str, Any], ids: list[int]) -> dict[str, Any]:
    """The request with its prompt as token ids."""
    out = {k: v for k, v in request.items() if k != "text"}
    out["input_ids"] = ids
    return out


def _engine_args(request: dict[str, Any]) -> dict[str, Any]:
    """A generate request dict as ``Engine.async_generate`` keyword arguments."""
    args = {k: request[k] for k in _ARG_KEYS if k in request}
    if "text" in request:
        args["prompt"] = request["text"]
    return args

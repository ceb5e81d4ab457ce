"""The server's side of the Engine: fan-out of requests, merged streams, disconnect aborts.

Every protocol turns its request into a ``GenBatch`` (one ``GenItem`` per prompt x sample, each
with its own rid) and hands it to ``EngineClient``. Each item is its own engine request, so the
scheduler batches them with everything else in flight, and the server always knows every rid
it must abort when the client goes away. Latency metrics are observed here, once for all
protocols.
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from starlette.requests import Request

from ..errors import error_of
from .errors import ClientDisconnected
from .metrics import ServerMetrics


# NOTE: a random prefix per process and a counter, not a uuid4 per request: uuid4 reads
# os.urandom, a system call on the event loop for every request that also lets go of the GIL
# (the engine's thread may then hold the loop up for a switch interval). Same 32 hex digits.
_RID_PREFIX = uuid.uuid4().hex[:16]
_rid_counter = itertools.count()


def new_rid() -> str:
    """A request id unique to this server process (and, by its random prefix, across them)."""
    return f"{_RID_PREFIX}{next(_rid_counter) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


@dataclass(frozen=True)
class GenItem:
    """One engine request: text or token ids, runtime sampling params (a dict) and its rid."""

    prompt: str | None
    input_ids: list[int] | None
    sampling: dict[str, Any]
    rid: str
    image_data: list[Any] | None = None  # mm: this prompt's images (decoded)


@dataclass(frozen=True)
class GenBatch:
    """All engine requests of one HTTP request, in answer order (prompt-major)."""

    items: tuple[GenItem, ...]
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fan_out(cls, prompts: Sequence[str | list[int]],
                sampling: dict[str, Any] | Sequence[dict[str, Any]], n: int = 1,
                rids: Sequence[str] | None = None,
                image_data: Sequence[list[Any] | None] | None = None,
                **logprob_kw: Any) -> "GenBatch":
        """One item per (prompt, sample); ``sampling`` is shared or one dict per prompt. With
        a seed and n > 1, sample i gets seed + i, so the n samples differ yet stay
        reproducible."""
        per_prompt = [sampling] * len(prompts) if isinstance(sampling, dict) else list(sampling)
        items = []
        for p, prompt in enumerate(prompts):
            for i in range(n):
                params = dict(per_prompt[p])
                if n > 1 and params.get("seed") is not None:
                    params["seed"] = params["seed"] + i
                rid = rids[p * n + i] if rids is not None else new_rid()
                is_text = isinstance(prompt, str)
                images = image_data[p] if image_data else None  # mm:
                items.append(GenItem(prompt if is_text else None,
                                     None if is_text else list(prompt), params, rid,
                                     images or None))
        return cls(tuple(items), **logprob_kw)

    def engine_kwargs(self, item: GenItem, stream: bool) -> dict[str, Any]:
        kw: dict[str, Any] = {"sampling_params": item.sampling, "rid": item.rid, "stream": stream}
        if item.image_data:  # mm:
            kw["image_data"] = item.image_data
        if item.prompt is not None:
            kw["prompt"] = item.prompt
        else:
            kw["input_ids"] = item.input_ids
        return self._logprob_kwargs(kw)

    def list_kwargs(self) -> dict[str, Any] | None:
        """Every item as one list call of the Engine (None when text and ids are mixed)."""
        kinds = {it.prompt is None for it in self.items}
        if len(kinds) != 1:
            return None
        kw: dict[str, Any] = {"sampling_params": [it.sampling for it in self.items],
                              "rid": [it.rid for it in self.items]}
        if any(it.image_data for it in self.items):  # mm: one prompt's images per entry
            kw["image_data"] = [it.image_data for it in self.items]
        if kinds == {False}:
            kw["prompt"] = [it.prompt for it in self.items]
        else:
            kw["input_ids"] = [it.input_ids for it in self.items]
        return self._logprob_kwargs(kw)

    def _logprob_kwargs(self, kw: dict[str, Any]) -> dict[str, Any]:
        if self.return_logprob:
            kw.update(return_logprob=True, logprob_start_len=self.logprob_start_len,
                      top_logprobs_num=self.top_logprobs_num,
                      return_text_in_logprobs=self.return_text_in_logprobs)
        return kw


async def wait_disconnect(request: Request) -> None:
    """Return when the client has gone away (its request body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class EngineClient:
    """Runs GenBatches on the engine; aborts whatever the caller stops waiting for."""

    def __init__(self, engine: Any, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.live: set[str] = set()  # rids submitted and not yet finished (for abort_all)

    def abort(self, rids: Sequence[str]) -> None:
        for rid in rids:
            try:
                self.engine.abort(rid)
            except Exception:  # aborting a finished or unknown request is not an error
                pass

    async def run(self, batch: GenBatch, request: Request | None = None,
                  per_request_errors: bool = False) -> list[dict[str, Any]]:
        """Final outputs, one per item. Raises ClientDisconnected (after aborting every item)
        if ``request``'s client goes away first. A request that failed while it ran raises its
        error, or with ``per_request_errors`` (an answer that is a list) is its own output,
        with the error in its finish_reason as the Engine's list calls report it."""
        # submitted in this step (see _start_single); a list answer's errors stay in it
        single = None if per_request_errors else self._start_single(batch)
        work = single if single is not None else asyncio.ensure_future(
            self._collect(batch, per_request_errors))
        watch = asyncio.ensure_future(wait_disconnect(request)) if request is not None else None
        if watch is not None:  # the client left: the work is cancelled (a no-op once done)
            # NOTE: a callback, not asyncio.wait over both: ~15 us less per request on the
            # server's loop (a waiter future and callbacks on both, per request; issue 29)
            watch.add_done_callback(lambda _: work.cancel())
        try:
            result = await work
        except asyncio.CancelledError:
            work.cancel()
            self.abort([it.rid for it in batch.items])
            if watch is not None and watch.done() and not watch.cancelled():
                raise ClientDisconnected() from None
            raise  # this handler was cancelled
        finally:
            if watch is not None:
                watch.cancel()
        return [result] if single is not None else result

    def _start_single(self, batch: GenBatch) -> asyncio.Future | None:
        """One text or ids prompt, started now through ``Engine.generate_nowait`` (None: not
        such a batch, or an engine without it). NOTE: in the handler's own step, not in a task
        of its own: a task ran a loop turn later, after the next poll of the sockets had begun
        the next requests, so a burst reached the submitter in more pieces (issue 29)."""
        nowait = getattr(self.engine, "generate_nowait", None)
        if nowait is None or len(batch.items) != 1 or batch.items[0].image_data:
            return None
        item = batch.items[0]
        kw = batch.engine_kwargs(item, False)
        del kw["stream"]
        start = time.perf_counter()
        future = nowait(**kw)
        self.live.add(item.rid)

        def finished(f: asyncio.Future) -> None:
            self.live.discard(item.rid)
            if not f.cancelled() and f.exception() is None:
                self.metrics.observe_output(f.result().get("meta_info", {}),
                                            time.perf_counter() - start)
        future.add_done_callback(finished)
        return future

    async def _collect(self, batch: GenBatch, per_request_errors: bool) -> list[dict[str, Any]]:
        # NOTE: non-streaming engine calls, not a stream read to its end: a stream detokenizes
        # every token, builds a cumulative dict per token and hops threads per token, which at
        # batch 256 cost the server path half the Engine's throughput (issue 29). TTFT and
        # inter-token latency are therefore observed on streamed requests only.
        kw = batch.list_kwargs()
        if kw is None or (len(batch.items) == 1 and not per_request_errors):
            return await self._gather(batch)
        outs = await self._call_list(batch, kw)
        if not per_request_errors:
            for out in outs:
                err = error_of(out.get("meta_info", {}).get("finish_reason"))
                if err is not None:
                    raise err
        return outs

    async def _call_list(self, batch: GenBatch, kw: dict[str, Any]) -> list[dict[str, Any]]:
        """All items as one Engine call: one message to the scheduler for the lot."""
        rids = [it.rid for it in batch.items]
        start = time.perf_counter()
        self.live.update(rids)
        try:
            outs = await _resolve(self.engine.async_generate(**kw))
        except asyncio.CancelledError:
            self.abort(rids)
            raise
        finally:
            self.live.difference_update(rids)
        elapsed = time.perf_counter() - start
        for out in outs:
            self.metrics.observe_output(out.get("meta_info", {}), elapsed)
        return list(outs)

    async def _gather(self, batch: GenBatch) -> list[dict[str, Any]]:
        if len(batch.items) == 1:  # no task of its own: the caller's task is the call's
            return [await self._call(batch, batch.items[0])]
        calls = [asyncio.ensure_future(self._call(batch, it)) for it in batch.items]
        try:
            return list(await asyncio.gather(*calls))
        except BaseException:
            for call in calls:  # one failed: the others' answer is never sent, so free them
                call.cancel()
            raise

    async def _call(self, batch: GenBatch, item: GenItem) -> dict[str, Any]:
        start = time.perf_counter()
        self.live.add(item.rid)
        try:
            out = await _resolve(self.engine.async_generate(**batch.engine_kwargs(item, False)))
        except asyncio.CancelledError:
            self.abort([item.rid])
            raise
        finally:
            self.live.discard(item.rid)
        self.metrics.observe_output(out.get("meta_info", {}), time.perf_counter() - start)
        return out

    async def stream(self, batch: GenBatch) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """Chunks of all items as they come, as (item index, cumulative chunk). Closing the
        iterator early aborts the unfinished items."""
        if len(batch.items) == 1:
            # NOTE: one item (every streamed chat turn) needs no merging: a pump task and a
            # queue per stream cost a task switch per chunk on the loop all streams share.
            item, ended = batch.items[0], False
            chunks = self._item_stream(batch, item)
            try:
                async for chunk in chunks:
                    yield 0, chunk
                ended = True
            finally:
                if not ended:  # closed early or failed: free the scheduler's work
                    self.abort([item.rid])
                await chunks.aclose()
            return
        queue: asyncio.Queue[tuple[int, dict[str, Any] | None, BaseException | None]] = (
            asyncio.Queue())
        finished: set[int] = set()

        async def pump(index: int, item: GenItem) -> None:
            try:
                async for chunk in self._item_stream(batch, item):
                    await queue.put((index, chunk, None))
                await queue.put((index, None, None))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                await queue.put((index, None, exc))

        tasks = [asyncio.ensure_future(pump(i, it)) for i, it in enumerate(batch.items)]
        try:
            while len(finished) < len(tasks):
                index, chunk, exc = await queue.get()
                if exc is not None:
                    raise exc
                if chunk is None:
                    finished.add(index)
                    continue
                yield index, chunk
        finally:
            for task in tasks:
                task.cancel()
            self.abort([it.rid for i, it in enumerate(batch.items) if i not in finished])

    async def _item_stream(self, batch: GenBatch, item: GenItem) -> AsyncIterator[dict[str, Any]]:
        self.live.add(item.rid)
        try:
            async for chunk in self._observed(batch, item):
                yield chunk
        finally:
            self.live.discard(item.rid)

    async def _observed(self, batch: GenBatch, item: GenItem) -> AsyncIterator[dict[str, Any]]:
        start = last = time.perf_counter()
        seen = 0
        chunks = await _resolve(self.engine.async_generate(**batch.engine_kwargs(item, True)))
        async for chunk in chunks:
            now = time.perf_counter()
            count = len(chunk.get("output_ids", ()))
            if count > seen:
                if seen == 0:
                    self.metrics.observe_first_token(now - start)
                else:
                    self.metrics.observe_tokens(now - last, count - seen)
                seen, last = count, now
            meta = chunk.get("meta_info", {})
            if meta.get("finish_reason") is not None:
                self.metrics.observe_output(meta, now - start)
            yield chunk


async def _resolve(value: Any) -> Any:
    """``async_generate`` may return an awaitable (of a dict or an async iterator) or an async
    iterator directly; accept both."""
    return await value if inspect.isawaitable(value) else value


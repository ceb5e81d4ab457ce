"""PDProxy: the router's prefill/decode mode. Each request goes to a pair of workers, as
SGLang's Model Gateway sends it: the same body, plus ``bootstrap_host``/``bootstrap_port`` (the
prefill worker's control store) and a random ``bootstrap_room`` pairing the two halves, to a
prefill worker (chosen by the configured policy: cache-aware, cost-aware...) and to a decode
worker (the least loaded). The client gets the decode worker's answer (streamed or not, through
the plain proxy's relay); the prefill worker's answer (its first token; never streamed) is read and dropped.

Faults: while the client has received nothing, a failure of either half (unreachable, a 5xx,
the transfer failed: the decode worker's 503) abandons both halves (closing a connection makes
that worker abort the request and free its KV) and retries with another pair; a prefill worker
refusing the request (4xx) answers the client. After the first byte, the relay ends the stream
with an error event, as for any worker.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random

from starlette.requests import Request
from starlette.responses import Response

from .policies import Choice
from .policies.base import least_loaded
from .proxy import AttemptFailed, Proxy, Upstream, _close, _unless_down, json_error
from .worker import Worker

logger = logging.getLogger(__name__)


class PrefillRefused(Exception):
    """The prefill worker answered the request with a client error: the client gets it."""

    def __init__(self, status: int, body: bytes, ctype: str | None) -> None:
        super().__init__(f"prefill worker answered {status}")
        self.response = Response(body, status_code=status,
                                 headers={"content-type": ctype} if ctype else None)


class PDProxy(Proxy):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        c = self.config
        self.prefill = frozenset(c.prefill_urls)
        self.decode = frozenset(c.decode_urls)
        self.ports = dict(zip(c.prefill_urls, c.prefill_bootstrap_ports))
        self._draining: set[asyncio.Task] = set()  # prefill answers read after the client's

    async def forward(self, request: Request, up: Upstream) -> Response:
        if not up.use_policy:  # info routes: any worker answers
            return await super().forward(request, up)
        payload = json.loads(up.body)
        tried: set[str] = set()
        reason = "no worker is registered"
        for attempt in range(self.config.max_retries + 1):
            prefills, decodes = self._candidates(tried)
            if not prefills or not decodes:
                reason = self._why_none() + ("" if prefills else " (no prefill worker)") + (
                    "" if decodes else " (no decode worker)")
                break
            if attempt:
                self.metrics.retries.labels(route=up.path).inc()
                await asyncio.sleep(self.backoff_s(attempt))
            prefill = self._choose(prefills, up)
            decode = Choice(least_loaded(decodes), "least_loaded")
            try:
                return await self._pair(request, up, payload, prefill, decode)
            except PrefillRefused as exc:
                return exc.response
            except AttemptFailed as exc:
                reason = str(exc)
                tried.update(w.url for w in (prefill.worker, decode.worker)
                             if w.url in reason)
                logger.warning("attempt %d of %s on %s + %s failed: %s", attempt + 1, up.path,
                               prefill.worker.url, decode.worker.url, reason)
        self.metrics.failed.labels(route=up.path, reason="no_worker").inc()
        return json_error(up.path, 503, f"no prefill/decode pair could serve the request: "
                                        f"{reason}")

    def _candidates(self, tried: set[str]) -> tuple[list[Worker], list[Worker]]:
        """Available prefill and decode workers, those that failed this request last."""
        def pick(role: frozenset[str]) -> list[Worker]:
            fresh = [w for w in self.registry.available(frozenset(tried)) if w.url in role]
            return fresh or [w for w in self.registry.available() if w.url in role]

        return pick(self.prefill), pick(self.decode)

    async def _pair(self, request: Request, up: Upstream, payload: dict, prefill: Choice,
                    decode: Choice) -> Response:
        """One attempt on a (prefill, decode) pair; AttemptFailed when either half failed
        before the client got a byte (both are then abandoned)."""
        host = prefill.worker.url.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
        boot = {"bootstrap_host": host, "bootstrap_port": self.ports[prefill.worker.url],
                "bootstrap_room": random.getrandbits(63)}
        # NOTE: the prefill half never streams: a server waiting for a stream's first chunk
        # does not watch its client, so a prefill half abandoned then would keep its KV until
        # its timeout; a plain request is aborted as soon as the router closes it.
        plain = {k: v for k, v in payload.items() if k != "stream_options"}
        p_up = dataclasses.replace(up, body=json.dumps({**plain, **boot, "stream": False}).encode(),
                                   stream=False)
        d_up = dataclasses.replace(up, body=json.dumps({**payload, **boot}).encode())
        p_task = asyncio.ensure_future(self._prefill_leg(prefill, p_up))
        d_task = asyncio.ensure_future(self._attempt(decode, request, d_up))
        handed = False
        try:
            await asyncio.wait({p_task, d_task}, return_when=asyncio.FIRST_COMPLETED)
            if not d_task.done():
                p_task.result()  # the prefill half failed first: raises
            resp = await d_task
            handed = True
            if resp.status_code != 200 and not p_task.done():
                # NOTE: the decode half refused (or the client left): its KV will never be
                # asked for; closing the prefill half frees it now, not at its timeout.
                p_task.cancel()
                await asyncio.gather(p_task, return_exceptions=True)
            elif not p_task.done():
                self._drain(p_task)
            return resp
        finally:
            if not handed:
                for task in (p_task, d_task):
                    if not task.done():
                        task.cancel()
                await asyncio.gather(p_task, d_task, return_exceptions=True)

    async def _prefill_leg(self, choice: Choice, up: Upstream) -> None:
        """Send to the prefill worker and read its whole answer (its first token)."""
        worker = choice.worker
        ticket = worker.start(choice.prefill, choice.decode)
        worker.breaker.on_attempt()
        try:
            resp = await self._send(worker, up)
            try:
                body = await _unless_down(worker, resp.aread())
            except Exception as exc:  # noqa: BLE001 - a read error or the worker found down
                raise self._failed(worker, "read", f"{type(exc).__name__}: {exc}") from exc
            finally:
                await _close(worker, resp)
            if resp.status_code >= 400:
                raise PrefillRefused(resp.status_code, body, resp.headers.get("content-type"))
            worker.breaker.on_success()
            worker.served += 1
        finally:
            worker.finish(ticket)
            worker.breaker.release()

    def _drain(self, task: asyncio.Task) -> None:
        """The client is answered; the prefill answer still ends (its KV is sent by then)."""
        self._draining.add(task)

        def done(t: asyncio.Task) -> None:
            self._draining.discard(t)
            if not t.cancelled() and t.exception() is not None:
                logger.warning("prefill half ended with %s", t.exception())

        task.add_done_callback(done)

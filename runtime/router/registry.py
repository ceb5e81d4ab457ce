"""The router's workers, added and removed at run time, and the health checks that mark them
down and up. Everything runs on the router's event loop: no locks."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import httpx

from ..errors import InvalidRequestError
from .breaker import CircuitBreaker
from .config import RouterConfig, normalize_worker_url
from .worker import Worker

logger = logging.getLogger(__name__)


class WorkerRegistry:
    """Workers by URL, in the order they were added. ``on_change`` is called with
    ``("add"|"remove", url)`` so a policy can keep its per-worker state (trees, hash ring)."""

    def __init__(self, config: RouterConfig,
                 on_change: Callable[[str, str], None] | None = None) -> None:
        self.config = config
        self.workers: dict[str, Worker] = {}
        self.on_change = on_change
        for url in config.worker_urls:
            self.add(url)

    def add(self, url: str) -> Worker:
        url = normalize_worker_url(url)
        if url in self.workers:
            raise InvalidRequestError(f"url: worker {url} is already registered", field="url")
        c = self.config
        worker = Worker(url, CircuitBreaker(c.breaker_failure_threshold,
                                            c.breaker_success_threshold, c.breaker_cooldown_s))
        self.workers[url] = worker
        if self.on_change:
            self.on_change("add", url)
        return worker

    def remove(self, url: str) -> Worker:
        url = normalize_worker_url(url)
        worker = self.workers.pop(url, None)
        if worker is None:
            raise InvalidRequestError(f"url: no worker {url} is registered", field="url")
        if self.on_change:
            self.on_change("remove", url)
        return worker

    def available(self, exclude: frozenset[str] = frozenset()) -> list[Worker]:
        return [w for w in self.workers.values() if w.url not in exclude and w.available]

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.healthy]

    def describe(self) -> list[dict]:
        return [w.describe() for w in self.workers.values()]


async def probe(client: httpx.AsyncClient, url: str, timeout_s: float) -> str:
    """``""`` if ``url``'s /health answers 200 within the timeout, else the reason."""
    try:
        resp = await client.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" or type(exc).__name__
    return "" if resp.status_code == 200 else f"/health answered {resp.status_code}"


class HealthChecker:
    """Probes every worker's ``/health`` each ``health_interval_s`` (all in parallel)."""

    def __init__(self, registry: WorkerRegistry, client: httpx.AsyncClient) -> None:
        self.registry = registry
        self.client = client
        self._task: asyncio.Task | None = None

    async def check_all(self, initial: bool = False) -> None:
        """One round of probes. ``initial``: one failure marks a worker down at once (at
        start-up nothing is known yet; later a single lost probe is forgiven)."""
        workers = list(self.registry.workers.values())
        c = self.registry.config
        reasons = await asyncio.gather(*(probe(self.client, w.url, c.health_timeout_s)
                                         for w in workers))
        for worker, reason in zip(workers, reasons):
            was = worker.healthy
            worker.record_health(not reason, 1 if initial else c.health_failure_threshold,
                                 c.health_success_threshold, reason)
            if was != worker.healthy:
                logger.warning("worker %s is %s%s", worker.url,
                               "up" if worker.healthy else "down", f": {reason}" if reason else "")
            if not worker.healthy:
                await self._cut_off(worker)

    @staticmethod
    async def _cut_off(worker: Worker) -> None:
        """Fail what still waits on a worker found down, at once instead of at the read
        timeout (retried elsewhere if the client got nothing yet)."""
        worker.wake_waiters()
        responses = list(worker.open_responses)
        worker.open_responses.clear()
        await asyncio.gather(*(r.aclose() for r in responses), return_exceptions=True)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.registry.config.health_interval_s)
            try:
                await self.check_all()
            except Exception:  # a bug here must not stop health checking for good
                logger.exception("health check round failed")

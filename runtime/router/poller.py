"""Polls every worker's ``GET /load`` each ``load_interval_s`` into its ledger (cost_aware).

One poll per worker in flight at a time (a worker busy with a long step answers late; its next
poll waits for that answer). A worker answering 404 is not an sgdsl server: it is not polled
again and the policy judges it by the router's own bookings. Other failures are left to the
health checks; the last report stays until a new one comes.
"""
from __future__ import annotations

import asyncio
import logging

import httpx

from .ledger import LoadReport
from .registry import WorkerRegistry
from .worker import Worker

logger = logging.getLogger(__name__)


class LoadPoller:
    def __init__(self, registry: WorkerRegistry, client: httpx.AsyncClient,
                 headers: dict[str, str] | None = None,
                 only: frozenset[str] | None = None) -> None:
        self.registry = registry
        self.client = client
        self.headers = headers or {}
        self.only = only  # pd: the prefill workers (None: every worker)
        self._task: asyncio.Task | None = None
        self._polling: dict[str, asyncio.Task] = {}  # worker URL -> its poll in flight

    async def poll(self, worker: Worker) -> None:
        """One /load of ``worker`` into its ledger."""
        ledger = worker.ledger
        epoch = ledger.requested()
        try:
            resp = await self.client.get(f"{worker.url}/load", headers=self.headers,
                                         timeout=self.registry.config.health_timeout_s)
        except httpx.HTTPError:
            return
        if resp.status_code == 404:
            ledger.supported = False
            logger.info("worker %s has no /load: judged by the router's bookings", worker.url)
        elif resp.status_code == 200:
            try:
                ledger.apply(LoadReport.from_json(resp.json()), epoch)
            except (ValueError, TypeError, AttributeError) as exc:
                logger.warning("bad /load answer from %s: %s", worker.url, exc)

    async def poll_all(self) -> None:
        await asyncio.gather(*(self.poll(w) for w in self._due()))

    def _due(self) -> list[Worker]:
        return [w for w in self.registry.workers.values()
                if w.healthy and w.ledger.supported and w.url not in self._polling
                and (self.only is None or w.url in self.only)]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._polling.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        interval = self.registry.config.load_interval_s
        while True:
            for worker in self._due():  # each on its own: a slow worker delays no other
                task = asyncio.get_running_loop().create_task(self.poll(worker))
                self._polling[worker.url] = task
                task.add_done_callback(lambda _, url=worker.url: self._polling.pop(url, None))
            await asyncio.sleep(interval)

"""One upstream server as the router sees it: URL, requests in flight, work left, health,
breaker."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .breaker import CircuitBreaker
from .ledger import WorkLedger


@dataclass
class Worker:
    url: str
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    healthy: bool = True
    load: int = 0  # requests the router has in flight on this worker
    health_failures: int = 0  # consecutive failed health checks
    health_successes: int = 0
    last_error: str = ""
    served: int = 0  # requests answered (any status) since it was added
    ledger: WorkLedger = field(default_factory=WorkLedger)  # tokens of work left (cost_aware)
    # Waits on this worker (for an answer's headers or body) and answers being streamed: when
    # the worker is found down they are woken or closed, so that requests on a silent (hung,
    # unplugged) worker fail over at once instead of at the read timeout.
    down_waiters: set[asyncio.Future] = field(default_factory=set)
    open_responses: set[Any] = field(default_factory=set)

    def down_signal(self) -> asyncio.Future:
        """A future that completes when this worker is found down."""
        future = asyncio.get_running_loop().create_future()
        self.down_waiters.add(future)
        future.add_done_callback(self.down_waiters.discard)
        return future

    def wake_waiters(self) -> None:
        for future in list(self.down_waiters):
            if not future.done():
                future.set_result(None)

    @property
    def available(self) -> bool:
        """Healthy and the breaker lets a request through."""
        return self.healthy and self.breaker.allows()

    def record_health(self, ok: bool, failure_threshold: int, success_threshold: int,
                      error: str = "") -> None:
        """Count a health check; the worker goes down after ``failure_threshold`` failed ones
        in a row and comes back after ``success_threshold`` good ones."""
        if ok:
            self.health_failures, self.health_successes = 0, self.health_successes + 1
            if not self.healthy and self.health_successes >= success_threshold:
                self.healthy = True
            return
        self.health_successes, self.health_failures = 0, self.health_failures + 1
        self.last_error = error
        if self.health_failures >= failure_threshold:
            self.healthy = False

    def start(self, prefill: float = 0.0, decode: float = 0.0) -> int:
        """A request is sent: count it (and book its estimated work); returns its ticket."""
        self.load += 1
        return self.ledger.book(prefill, decode)

    def finish(self, ticket: int) -> None:
        """The request's answer has ended (or failed)."""
        self.load -= 1
        self.ledger.release(ticket)

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "healthy": self.healthy, "load": self.load,
                "circuit": self.breaker.state, "served": self.served,
                "last_error": self.last_error or None, "work": self.ledger.describe()}

"""A circuit breaker per worker: after ``failure_threshold`` consecutive failed requests the
worker gets no traffic for ``cooldown_s``; then trial requests go through one at a time
(half-open) and ``success_threshold`` good ones close it again, one bad one reopens it."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_CODES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}  # exported as a gauge


@dataclass
class CircuitBreaker:
    failure_threshold: int = 5
    success_threshold: int = 2
    cooldown_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    state: str = CLOSED
    failures: int = 0  # consecutive, while closed
    successes: int = 0  # consecutive trial successes, while half-open
    opened_at: float = 0.0
    trial_in_flight: bool = False
    times_opened: int = field(default=0)

    def allows(self) -> bool:
        """Whether a request may be sent now (does not reserve the trial slot)."""
        if self.state == OPEN and self.clock() - self.opened_at >= self.cooldown_s:
            self.state, self.successes, self.trial_in_flight = HALF_OPEN, 0, False
        if self.state == HALF_OPEN:
            return not self.trial_in_flight
        return self.state == CLOSED

    def on_attempt(self) -> None:
        """A request was sent: in half-open state it is the one trial in flight."""
        if self.state == HALF_OPEN:
            self.trial_in_flight = True

    def release(self) -> None:
        """The request ended without telling whether the worker is fine (the client left):
        free the trial slot so the next request can be the trial."""
        self.trial_in_flight = False

    def on_success(self) -> None:
        if self.state == HALF_OPEN:
            self.trial_in_flight = False
            self.successes += 1
            if self.successes >= self.success_threshold:
                self.state, self.failures = CLOSED, 0
            return
        self.failures = 0

    def on_failure(self) -> None:
        if self.state == HALF_OPEN:
            self._open()
            return
        self.failures += 1
        if self.state == CLOSED and self.failures >= self.failure_threshold:
            self._open()

    def _open(self) -> None:
        self.state, self.opened_at, self.trial_in_flight = OPEN, self.clock(), False
        self.failures, self.successes = 0, 0
        self.times_opened += 1

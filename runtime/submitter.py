"""``Submitter``: single requests issued on one caller loop while that loop keeps accepting more
go to the engine's loop in one hand-off, and from there to the scheduler in one message.

A server answers every HTTP request with its own ``async_generate`` call. One call each cost a
cross-thread hop (a task and a chained future on the engine loop, a self-pipe write), a ZMQ
message and a wake-up back per request, all while the server's loop parsed the next requests:
a burst of 256 reached the scheduler as a trickle, which admitted it in more, smaller prefill
waves with decode steps between them (issue 29).

When the hand-off goes (no timer, no window): a check runs at the loop's next turn after a
submission. It hands everything off unless the turn before it brought new submissions or new
intake (``touch()``: a server's connection accepted, request bytes read): then the loop is still
working through a burst it has already taken in (the requests of one poll of the sockets run
their handlers one turn after the next poll; a burst of clients' connections is accepted before
their requests are read), and the check looks again at the next turn. So a lone request waits two loop turns (microseconds on an idle loop), and a burst read
over consecutive turns travels together instead of its first request going alone (issue 29
item 1: 3-6 hand-offs per burst of 256, the first a single request, before). Bounds, so that
nothing waits behind a stream that never pauses: a group is handed off at once when it holds a
prefill batch's tokens or a running batch's requests (the scheduler could not take more in one
step; with an accelerator, by the submission that fills it, so the first prefill wave starts
while the loop parses the rest of the burst), or after ``MAX_DEFERRALS`` looks. ``hold()`` (released by the returned callable) keeps
the hand-off for work about to submit (a burst's prompts being encoded off the loop, which come
back together a few turns later).

Each request still gets its own result or error as soon as it finishes (not when the slowest of
its group does), through the caller loop's ``Mailbox`` (one wake-up per engine-loop pass); a
request cancelled before the hand-off is never sent.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from .errors import EngineDeadError
from .mailbox import Mailbox

# engine loop: start(specs, settle) tracks and sends them; settle(index, result or exception)
Start = Callable[[list[Any], Callable[[int, Any], None]], None]
# NOTE: a stream that never pauses still goes every few turns (each turn of a busy server loop
# runs a whole poll's worth of requests, so this is a few groups, not a few requests).
MAX_DEFERRALS = 8


@dataclass(frozen=True)
class HandoffLimits:
    """A pending group this large goes at once: ``tokens`` prompt tokens (the scheduler's
    prefill batch) or ``requests`` requests (its running batch)."""

    tokens: int
    requests: int
    # NOTE: True where the forwards run on an accelerator: a full group then goes from the
    # submission that fills it, so the rest of a burst is parsed while the first prefill wave
    # runs (issue 29 item 1). Not on a CPU device, where the wave and the parsing compete for
    # the same cores (2-core box: server/Engine wall 1.16x eager vs 1.00x, burst of 256).
    eager: bool = False


class _Slot:
    """Where one request's outcome lands on the caller loop (a Mailbox target)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future) -> None:
        self.future = future

    def put_nowait(self, outcome: Any) -> None:
        if self.future.done():  # the caller stopped waiting (cancelled)
            return
        if isinstance(outcome, BaseException):
            self.future.set_exception(outcome)
        else:
            self.future.set_result(outcome)


class Submitter:
    """One per caller loop: ``submit(spec)`` on that loop; the pending specs go to ``start``
    on the engine loop once the caller loop has taken in what it was given (see the module)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, engine_loop: asyncio.AbstractEventLoop,
                 start: Start, box: Mailbox, limits: HandoffLimits | None = None) -> None:
        self.loop = loop
        self.engine_loop = engine_loop
        self.start = start
        self.box = box
        self.limits = limits
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._tokens = 0  # prompt tokens pending
        self._fresh = False  # a submission since the last check
        self._looks = 0  # checks that deferred the pending group
        self._holds = 0
        self._scheduled = False
        self.handoffs = 0  # hand-offs to the engine loop so far (stats: submit_handoffs)
        self.requests = 0  # requests handed off (stats: submit_requests)

    def submit(self, spec: Any) -> asyncio.Future:
        future = self.loop.create_future()
        self._pending.append((spec, future))
        self._tokens += _prompt_tokens(spec)
        self._fresh = True
        if self.limits is not None and self.limits.eager and self._full():
            # NOTE: at once, from the handler that filled it: the loop turn's remaining handlers
            # (a poll's worth of a burst: 256 parses, ~0.4 ms each on an H200 host) would
            # otherwise run before the check, with the scheduler idle (issue 29 item 1)
            self._flush()
        else:
            self._schedule()
        return future

    def touch(self) -> None:
        """The loop took work in (a connection, request bytes): the next check looks again."""
        self._fresh = True

    def hold(self) -> Callable[[], None]:
        """Keep the next hand-off until the returned ``release()`` (call it once, on this
        loop): for requests on their way (their prompts being encoded)."""
        self._holds += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._holds -= 1
                if self._holds == 0 and self._pending:
                    self._fresh = True  # the held work has just submitted (or failed)
                    self._schedule()
        return release

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._check)

    def _check(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        if not self._full() and self._looks < MAX_DEFERRALS:
            if self._holds:  # release() looks again
                return
            if self._fresh:  # the loop is still taking a burst in: look again next turn
                self._fresh = False
                self._looks += 1
                self._schedule()
                return
        self._flush()

    def _full(self) -> bool:
        limits = self.limits
        return limits is not None and (self._tokens >= limits.tokens
                                       or len(self._pending) >= limits.requests)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        self._tokens, self._fresh, self._looks = 0, False, 0
        live = [(spec, fut) for spec, fut in pending if not fut.done()]  # cancelled: not sent
        if not live:
            return
        self.handoffs += 1
        self.requests += len(live)
        slots = [_Slot(fut) for _, fut in live]
        try:
            self.engine_loop.call_soon_threadsafe(
                self.start, [spec for spec, _ in live],
                lambda i, outcome: self.box.put(slots[i], outcome))  # type: ignore[arg-type]
        except RuntimeError:  # the engine's loop is closed
            for slot in slots:
                slot.put_nowait(EngineDeadError("the engine was shut down"))


def _prompt_tokens(spec: Any) -> int:
    reqs = getattr(spec, "reqs", None)
    return sum(len(r.input_ids) for r in reqs) if reqs else 0

"""``intake_protocol``: uvicorn's HTTP protocol (httptools, else h11: uvicorn's ``auto``) that
tells the Engine what the server's loop is taking in, so a burst goes to the scheduler whole.

The Engine hands the requests of a loop off when a turn of that loop brought nothing new
(runtime/submitter.py). A burst of clients first opens its connections, which the loop accepts
before it reads any request on them, and each client writes its request as its own connection
completes: the first request read went alone while the others were still on their way (issue
29: a burst's first request prefilled and decoded alone, the rest in later, extra steps). Now
every read counts as intake (the pending group stays open while reads keep coming), and the
connections of a burst of accepts hold the hand-off (``AcceptWindow``) until their first bytes
arrive, they close, or ``EXPECT_S`` passes after the burst's last accept (at most
``EXPECT_MAX_S`` after its first): the requests the loop has accepted go together. A lone
request on a fresh connection waits for nothing: its own bytes release its hold before it is
submitted, and connections accepted earlier whose holds expired never hold again.
"""
from __future__ import annotations

import asyncio
import weakref
from typing import Any, Callable

# NOTE: how long accepted connections are expected to send their requests after the last
# accept of their burst (32 clients write within a few ms of their connects on a loaded 2-core
# box; 256 aiohttp connects there took ~150 ms, in batches further apart than this, so such a
# burst's first request may still go alone), and the most a burst of accepts may hold a
# pending request. Evidence-bound: with no connection accepted and silent, nothing waits.
EXPECT_S = 0.005
EXPECT_MAX_S = 0.05


class AcceptWindow:
    """One per server loop: the silent connections of the current burst of accepts, each
    holding the engine's next hand-off (``engine.hold_handoff()``) until it is heard from."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        self.silent: dict[int, Callable[[], None]] = {}  # id(protocol) -> release
        self.first = self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def accepted(self, key: int) -> None:
        now = self.loop.time()
        if not self.silent:
            self.first = now
        self.silent[key] = self.engine.hold_handoff()
        self.deadline = min(now + EXPECT_S, self.first + EXPECT_MAX_S)
        if self.timer is None:
            self.timer = self.loop.call_at(self.deadline, self._expire)

    def heard(self, key: int) -> None:
        """The connection's first bytes came, or it closed."""
        release = self.silent.pop(key, None)
        if release is not None:
            release()

    def _expire(self) -> None:
        self.timer = None
        if self.loop.time() < self.deadline and self.silent:
            self.timer = self.loop.call_at(self.deadline, self._expire)
            return
        silent, self.silent = self.silent, {}
        for release in silent.values():  # silent too long: they no longer hold anything
            release()


def intake_protocol(engine: Any) -> type[asyncio.Protocol]:
    """uvicorn's ``auto`` HTTP protocol class, reporting to ``engine`` (``note_intake``,
    ``hold_handoff``) on the server's loop."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> AcceptWindow

    class IntakeProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]
        _window: AcceptWindow | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            loop = asyncio.get_running_loop()
            window = windows.get(loop)
            if window is None:
                window = windows[loop] = AcceptWindow(engine, loop)
            self._window = window
            window.accepted(id(self))
            engine.note_intake()
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            engine.note_intake()
            if self._window is not None:
                self._window.heard(id(self))
                self._window = None
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._window is not None:
                self._window.heard(id(self))
                self._window = None
            super().connection_lost(exc)
    return IntakeProtocol


def http_protocol(app: Any) -> Any:
    """uvicorn's ``http`` setting for ``app`` (one of ours, built by ``create_app``): the
    intake protocol when its engine takes intake notes, else ``"auto"``."""
    state = getattr(app, "state", None)
    engine = getattr(getattr(state, "ctx", None), "engine", None)
    if all(hasattr(engine, name) for name in ("note_intake", "hold_handoff")):
        return intake_protocol(engine)
    return "auto"

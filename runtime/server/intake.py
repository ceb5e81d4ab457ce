"""``intake_protocol``: uvicorn's HTTP protocol (httptools, else h11: uvicorn's ``auto``) that
tells the Engine when the server's loop takes work in, so a burst goes to the scheduler whole.

The Engine hands the requests of a loop off when a turn of that loop brought nothing new
(runtime/submitter.py). A burst of clients first opens its connections, which the loop accepts
over several turns before it reads any request on them: the first request read could go alone
while the others' connections were still being accepted (issue 29: a burst's first request
prefilled and decoded alone, the rest in later, extra steps). Each accepted connection and each
read now counts as intake, so those turns keep the pending group open (for a few turns at most).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable


def intake_protocol(on_intake: Callable[[], None]) -> type[asyncio.Protocol]:
    """uvicorn's ``auto`` HTTP protocol class, calling ``on_intake()`` (on the server's loop)
    for every connection accepted and every read."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class IntakeProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            on_intake()
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            on_intake()
            super().data_received(data)
    return IntakeProtocol


def http_protocol(app: Any) -> Any:
    """uvicorn's ``http`` setting for ``app`` (one of ours, built by ``create_app``): the
    intake protocol when its engine takes intake notes, else ``"auto"``."""
    state = getattr(app, "state", None)
    engine = getattr(getattr(state, "ctx", None), "engine", None)
    note = getattr(engine, "note_intake", None)
    return intake_protocol(note) if note is not None else "auto"

"""Bootstrap: which prefill server a request's KV comes from, and the room pairing its two halves.

As in SGLang, the router puts ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` in the
body of the request it sends to both the prefill and the decode server. The server's middleware
(``http.py``) takes them out of the body and opens a scope for the request; every engine request
built in that scope (``next_bootstrap``: the request builder calls it) gets a ``Bootstrap`` whose
``key`` is the room plus the request's index in the scope, so an HTTP request that fans out
(a batch, n > 1) pairs its k-th engine request on both sides: both servers build them from the
same body in the same order.
"""
from __future__ import annotations

import contextvars
import itertools
from dataclasses import dataclass, field
from typing import Iterator


@dataclass(frozen=True)
class Bootstrap:
    """The prefill server's control store (``host:port``) and the pairing key of one request."""

    host: str
    port: int
    key: str

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port


@dataclass
class _Scope:
    host: str
    port: int
    room: int
    counter: Iterator[int] = field(default_factory=itertools.count)


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("pd_bootstrap",
                                                                      default=None)


def open_scope(host: str, port: int, room: int) -> contextvars.Token:
    """Requests built from now on in this context (the HTTP request's task) carry the room."""
    return _SCOPE.set(_Scope(host, port, room))


def close_scope(token: contextvars.Token) -> None:
    _SCOPE.reset(token)


def next_bootstrap() -> Bootstrap | None:
    """The next engine request's bootstrap in the current scope (None outside one)."""
    scope = _SCOPE.get()
    if scope is None:
        return None
    return Bootstrap(scope.host, scope.port, f"{scope.room}.{next(scope.counter)}")

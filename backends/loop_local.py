"""``LoopLocal``: one async HTTP client per asyncio event loop.

httpx (and the openai/anthropic clients built on it) bind pooled connections to the loop that
opened them; the sync facade may run each program on a fresh loop, so a backend keeps one
client per live loop instead of one per backend."""
from __future__ import annotations

import asyncio
import weakref
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class LoopLocal(Generic[T]):
    """Lazily builds ``factory()`` once per running event loop."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T]" = (
            weakref.WeakKeyDictionary())

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        value = self._by_loop.get(loop)
        if value is None:
            value = self._by_loop[loop] = self._factory()
        return value

    async def aclose_current(self) -> None:
        """Close the current loop's client (others die with their loops)."""
        loop = asyncio.get_running_loop()
        value: Any = self._by_loop.pop(loop, None)
        close = getattr(value, "aclose", None) or getattr(value, "close", None)
        if close is not None:
            await close()

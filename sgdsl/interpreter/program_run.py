"""``ProgramRun``: what one program run shares across its state and every fork of it (the
backend, the event loop, the chat template, default sampling, usage), and when it is done."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from sgdsl import ir
from sgdsl.backends.base import Backend
from sgdsl.chat_template import ChatTemplate
from sgdsl.interpreter.loop import loop_calls
from sgdsl.interpreter.usage import Usage

if TYPE_CHECKING:
    from sgdsl.interpreter.executor import StateExecutor


@dataclass
class ProgramRun:
    """What a program state and all its forks share. The run is *done* when the body has
    returned and every state (forks included, joined or not) is idle; ``when_done`` callbacks
    then fire once, on whichever thread finished last."""

    backend: Backend
    loop: asyncio.AbstractEventLoop
    template: ChatTemplate
    defaults: ir.SamplingParams = ir.SamplingParams()
    stream: bool = False
    spec_tokens: int | None = None
    usage: Usage = field(default_factory=Usage)
    started: float = field(default_factory=time.perf_counter)
    elapsed_s: float | None = None  # set when the run is done
    executors: list["StateExecutor"] = field(default_factory=list)
    body_ended: bool = False
    done: bool = False
    _callbacks: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    call_soon: Callable[..., None] = field(init=False)  # onto ``loop``, from any thread

    def __post_init__(self) -> None:
        self.call_soon = loop_calls(self.loop)

    def cancel(self) -> None:
        for ex in list(self.executors):
            ex.cancel()

    def end_body(self) -> None:
        self.body_ended = True
        self.check_done()

    def when_done(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self.done:
                self._callbacks.append(callback)
                return
        callback()

    def check_done(self) -> None:
        # NOTE: the body thread sets body_ended before checking, the loop marks a node done
        # before checking body_ended: one of them sees both, and the lock fires callbacks once.
        if not self.body_ended or self.done or not all(ex.idle for ex in list(self.executors)):
            return
        with self._lock:
            if self.done:
                return
            self.done = True
            self.elapsed_s = time.perf_counter() - self.started
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

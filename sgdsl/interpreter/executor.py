"""``StateExecutor``: one program state's text, messages and variables, and the in-order
execution of the nodes appended to it.

Nodes are submitted from the program body's thread and executed by a drain task on the run's
event loop. A failed node stores the real exception (annotated with the program line that
appended it), drops the nodes queued after it, and wakes every waiter; the body then sees the
same exception at its next ``s += ...`` or ``s["x"]``.
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, NamedTuple

from sgdsl import ir
from sgdsl.backends.base import Context, ImageData, Message
from sgdsl.errors import ProgramCancelledError
from sgdsl.interpreter import generation, nodes
from sgdsl.interpreter.callsite import CallSite, annotate
from sgdsl.interpreter.records import CallRecord, ForkRecord
from sgdsl.interpreter.program_run import ProgramRun
from sgdsl.interpreter.signal import Signal


class Segment(NamedTuple):
    """A piece of the text, for rendering. ``kind``: text; begin / end (a turn's opening and
    closing role markup from the chat template); gen (generated, ``call`` indexes
    ``StateExecutor.calls``); image (``call`` indexes ``images_``; text is the image token, or
    empty on chat APIs); fork (a marker: ``call`` indexes ``StateExecutor.forks``).
    (A named tuple: one is built per appended piece.)"""

    role: str | None
    kind: str
    text: str
    name: str | None = None
    call: int | None = None


_LOCAL_NODES = (ir.Text, ir.RoleBegin, ir.RoleEnd, ir.VarScopeBegin, ir.VarScopeEnd)


def is_local(node: ir.Node) -> bool:
    """Nodes that only edit the state (no backend, no I/O): they can run in the body's thread."""
    if isinstance(node, ir.Sequence):
        return all(is_local(item) for item in node.items)
    return isinstance(node, _LOCAL_NODES)


def declared_vars(node: ir.Node) -> tuple[str, ...]:
    """Variables a node will set (so ``s["x"]`` knows to wait for them)."""
    if isinstance(node, ir.Sequence):
        return tuple(n for item in node.items for n in declared_vars(item))
    if isinstance(node, ir.Gen) and node.reasoning_name is not None:
        return (node.name, node.reasoning_name)
    if isinstance(node, (ir.Gen, ir.Select)) and node.name is not None:
        return (node.name,)
    if isinstance(node, ir.VarScopeEnd):
        return (node.name,)
    return ()


class StateExecutor:
    def __init__(self, run: ProgramRun) -> None:
        self.run, self.backend, self.template = run, run.backend, run.template
        self.text_ = ""
        self.messages_: list[Message] = []
        self.cur_role: str | None = None
        self.cur_role_begin = 0
        self.images_: list[ImageData] = []
        self.cur_images: list[ImageData] = []
        self.variables: dict[str, Any] = {}
        self.parsed: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.segments: list[Segment] = []
        self.calls: list[CallRecord] = []
        self.forks: list[ForkRecord] = []
        self.call_: CallRecord | None = None  # the gen/select running now
        self.scopes: dict[str, int] = {}
        self.fork_start = self.fork_segment = 0  # where a fork's own text and segments begin
        self.speculated = ""  # API speculative execution: text generated ahead of the program
        self.error_: BaseException | None = None
        self.signal = Signal()
        self.pending: dict[str, int] = {}
        self._queue: deque[tuple[ir.Node, CallSite | None, tuple[str, ...]]] = deque()
        self._lock = threading.Lock()
        self._busy = False  # nodes are queued or running on the loop
        self._submitted = self._done = 0
        self._ended = False
        self._task: asyncio.Task | None = None
        self._current: ir.Node | None = None
        run.executors.append(self)

    # ---- submission and waiting (program body's thread) --------------------------------

    def submit(self, node: ir.Node, site: CallSite | None = None) -> None:
        """Append a node. Text, roles and scopes run right here when nothing is queued ahead
        of them (no loop round trip); the rest goes to the drain task on the run's loop."""
        self.raise_if_failed()
        names = declared_vars(node)
        with self._lock:
            self._submitted += 1
            for name in names:
                self.pending[name] = self.pending.get(name, 0) + 1
            inline = not self._busy and is_local(node)
            start = False
            if not inline:
                self._queue.append((node, site, names))
                start, self._busy = not self._busy, True
        if inline:
            self._run_inline(node, site, names)
        elif start:
            self.run.call_soon(self._start_drain)

    def raise_if_failed(self) -> None:
        if self.error_ is not None:
            raise self.error_

    @property
    def idle(self) -> bool:
        return self.error_ is not None or self._done >= self._submitted

    @property
    def finished(self) -> bool:
        """The body has returned and every node has run (or the state failed)."""
        return self.error_ is not None or (self._ended and self._done >= self._submitted)

    def sync(self) -> None:
        self._check_not_on_loop()
        self.signal.wait_for(lambda: self.idle)

    def end(self) -> None:
        self._ended = True
        self.signal.notify()

    def get_var(self, name: str) -> Any:
        if self.pending.get(name):
            self._check_not_on_loop()
            self.signal.wait_for(lambda: self.error_ is not None or not self.pending.get(name))
        if name in self.variables:
            return self.variables[name]
        self.raise_if_failed()
        raise KeyError(name)

    def cancel(self) -> None:
        if _running_loop() is self.run.loop:
            self._cancel_on_loop()
        else:
            self.run.loop.call_soon_threadsafe(self._cancel_on_loop)

    def fork(self, size: int) -> list["StateExecutor"]:
        if size > 1 and self.text_:
            self.submit(ir.CommitLazy())  # let the backend cache the shared prefix once
        self.sync()
        self.raise_if_failed()
        children = [self._child() for _ in range(int(size))]
        self.forks.append(ForkRecord(children))
        self.mark("fork", len(self.forks) - 1)
        return children

    def _child(self) -> "StateExecutor":
        ex = StateExecutor(self.run)
        ex.text_, ex.messages_ = self.text_, list(self.messages_)
        ex.cur_role, ex.cur_role_begin = self.cur_role, self.cur_role_begin
        ex.images_, ex.cur_images = list(self.images_), list(self.cur_images)
        ex.variables, ex.parsed = dict(self.variables), dict(self.parsed)
        ex.meta_info, ex.segments = dict(self.meta_info), list(self.segments)
        ex.calls, ex.fork_segment = list(self.calls), len(self.segments)
        ex.scopes, ex.fork_start = dict(self.scopes), len(self.text_)
        return ex

    def _check_not_on_loop(self) -> None:
        if _running_loop() is self.run.loop:
            raise RuntimeError("sgdsl: this call would block the event loop the program runs on; "
                               "await the program (arun) before reading its state")

    # ---- execution (event loop) ---------------------------------------------------------

    def _run_inline(self, node: ir.Node, site: CallSite | None, names: tuple[str, ...]) -> None:
        try:
            nodes.run_local(self, node)
        except Exception as exc:
            self._fail(exc, site, node)
            raise
        self._node_done(names)

    def _node_done(self, names: tuple[str, ...]) -> None:
        # NOTE: only the thread running nodes (the body's while idle, else the loop's) writes
        # _done; ``pending`` is also written by the submitting thread, hence the lock.
        if names:
            with self._lock:
                for name in names:
                    self.pending[name] -= 1
        self._done += 1
        self.signal.notify()

    def _start_drain(self) -> None:
        self._task = self.run.loop.create_task(self._drain())

    async def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self.error_ is not None:
                    self._busy = False
                    break
                node, site, names = self._queue.popleft()
            try:
                await self.execute(node)
            except asyncio.CancelledError:
                self._fail(ProgramCancelledError("the program was cancelled"), None, node)
                raise
            except Exception as exc:  # noqa: BLE001 - stored and re-raised in the body
                self._fail(exc, site, node)
                break
            self._node_done(names)
        self.run.check_done()

    def _fail(self, exc: BaseException, site: CallSite | None, node: ir.Node | None) -> None:
        if self.error_ is not None:
            return
        annotate(exc, site, _describe(self._current if isinstance(node, ir.Sequence) else node))
        self.error_ = exc
        self._queue.clear()
        with self._lock:
            # NOTE: a variable cut off mid-stream is not a value: reading it raises the error.
            for name, count in self.pending.items():
                if count:
                    self.variables.pop(name, None)
            self.pending.clear()
            self._busy = False
        self.signal.notify()
        self.run.check_done()

    def _cancel_on_loop(self) -> None:
        self._fail(ProgramCancelledError("the program was cancelled"), None, None)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def execute(self, node: ir.Node) -> None:
        if isinstance(node, ir.Sequence):
            for item in node.items:
                await self.execute(item)
            return
        self._current = node  # the innermost node, for error messages
        if isinstance(node, (ir.Gen, ir.Select)):
            await self._execute_call(node)
        else:
            await nodes.run_node(self, node)

    async def _execute_call(self, node: ir.Gen | ir.Select) -> None:
        self.call_ = record = CallRecord.of(node)
        self.calls.append(record)
        try:
            if isinstance(node, ir.Gen):
                await generation.run_gen(self, node)
            else:
                await generation.run_select(self, node)
        except BaseException as e:
            record.finish(e)
            raise
        else:
            record.finish()
        finally:
            self.call_ = None

    # ---- state updates (event loop) -----------------------------------------------------

    def fill(self, value: str, kind: str = "text", name: str | None = None) -> None:
        if not value:
            return
        self.text_ += value
        call = len(self.calls) - 1 if kind == "gen" else None
        last = self.segments[-1] if self.segments else None
        if last is not None and last[:2] == (self.cur_role, kind) and last[3:] == (name, call):
            self.segments[-1] = Segment(last.role, kind, last.text + value, name, call)
        else:
            self.segments.append(Segment(self.cur_role, kind, value, name, call))
        if self.run.stream:
            self.signal.notify()

    def mark(self, kind: str, index: int, text: str = "") -> None:
        """A segment that points at something besides text (an image, a fork)."""
        self.text_ += text
        self.segments.append(Segment(self.cur_role, kind, text, None, index))

    def context(self) -> Context:
        """A snapshot for the backend: the text, the messages (the open turn last)."""
        messages = list(self.messages_)
        if self.cur_role is not None:
            partial = self.text_[self.cur_role_begin:].lstrip()
            messages.append(Message(self.cur_role, partial, tuple(self.cur_images)))
        return Context(text=self.text_, messages=tuple(messages), open_role=self.cur_role,
                       images=tuple(self.images_))


def _describe(node: ir.Node | None) -> str:
    if isinstance(node, (ir.Gen, ir.Select)):
        return f"{type(node).__name__.lower()}({node.name!r})"
    return "the program" if node is None else type(node).__name__


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

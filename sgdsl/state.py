"""``ProgramState`` (the ``s`` of a program) and ``ProgramStateGroup`` (what ``s.fork(n)``
returns), with SGLang's semantics."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, AsyncIterator, Iterator

from sgdsl import ir
from sgdsl.interpreter.callsite import capture
from sgdsl.interpreter.executor import StateExecutor
from sgdsl.interpreter.stream_meta import since
from sgdsl.role_methods import RoleMethods


class ProgramState(RoleMethods):
    def __init__(self, executor: StateExecutor) -> None:
        self.stream_executor = executor
        self.ret_value: Any = None

    # ---- building ---------------------------------------------------------------------

    def __iadd__(self, other: Any) -> "ProgramState":
        if isinstance(other, (ProgramState, ProgramStateGroup)):
            raise TypeError("cannot append a program state; append its text() or variables")
        self.stream_executor.submit(ir.as_node(other), capture())
        return self

    def _role(self, role: str, expr: Any = None) -> Any:
        if expr is not None:
            self.stream_executor.submit(ir.Sequence((ir.RoleBegin(role), ir.as_node(expr), ir.RoleEnd(role))),
                                        capture())
            return self
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.stream_executor.submit(ir.RoleBegin(role), capture())
        yield
        self.stream_executor.submit(ir.RoleEnd(role), capture())

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside becomes variable ``name``."""
        self.stream_executor.submit(ir.VarScopeBegin(name), capture())
        yield
        self.stream_executor.submit(ir.VarScopeEnd(name), capture())

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> "ProgramStateGroup":
        """``size`` copies of this state that continue independently (and in parallel)."""
        children = self.stream_executor.fork(size)
        return ProgramStateGroup([ProgramState(ex) for ex in children], self)

    @contextmanager
    def copy(self, position_ids_offset: Any = None) -> Iterator["ProgramState"]:
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    # ---- reading ----------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables or bool(self.stream_executor.pending.get(name))

    def get_var(self, name: str) -> Any:
        """A variable's value, waiting for it if it is still being generated; raises the
        program's error (not a KeyError) if the program failed before setting it."""
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.variables[name] = value

    def get_parsed(self, name: str) -> Any:
        """The parsed value of a constrained gen: the int of ``gen_int``, the object of a
        ``json_schema`` gen (a pydantic instance when the schema was a model)."""
        self.get_var(name)
        return self.stream_executor.parsed.get(name)

    def tool_calls(self, name: str) -> list[Any]:
        """The tool calls of ``gen(name, tools=...)`` (``sgdsl.tools.ToolCall``; empty if the
        model answered in text)."""
        from sgdsl.tools import calls_of

        return calls_of(self.get_meta_info(name))

    def get_meta_info(self, name: str) -> Any:
        self.get_var(name)
        return self.stream_executor.meta_info.get(name)

    def text(self) -> str:
        self.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, Any]]:
        """The conversation in OpenAI chat format (images as ``image_url`` parts)."""
        self.sync()
        return [_message_dict(m) for m in self.stream_executor.messages_]

    def usage(self) -> dict[str, Any]:
        """Token and cost totals of the whole program run (forks included)."""
        self.sync()
        return self.stream_executor.run.usage.as_dict()

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        self.sync()
        return self.stream_executor.error_

    def cancel(self) -> None:
        """Abort the program: in-flight backend requests are cancelled, the body stops at its
        next interaction with the state."""
        self.stream_executor.run.cancel()

    # ---- streaming --------------------------------------------------------------------

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is generated (the whole text, or one variable). Without ``stream=True``
        yields the final value once. Raises the program's error at the end, if any."""
        ex = self.stream_executor
        if not ex.run.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        reader = _Reader(ex, var_name)
        while True:
            seen = ex.signal.version
            chunk, done = reader.read()
            if chunk:
                yield chunk
            if done:
                break
            ex.signal.wait_for(lambda: ex.signal.version != seen or ex.finished)
        ex.raise_if_failed()

    async def text_async_iter(self, var_name: str | None = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """``text_iter`` for async code; with ``return_meta_data`` yields (chunk, meta_info)."""
        ex = self.stream_executor
        if not ex.run.stream:
            await ex.signal.async_wait_for(
                lambda: ex.finished or (var_name is not None and not ex.pending.get(var_name)))
            value = ex.text_ if var_name is None else self.get_var(var_name)
            yield (value, ex.meta_info.get(var_name)) if return_meta_data else value
            return
        reader = _Reader(ex, var_name)
        while True:
            seen = ex.signal.version
            chunk, done = reader.read()
            if chunk:
                yield (chunk, reader.meta()) if return_meta_data else chunk
            if done:
                break
            await ex.signal.async_wait_for(lambda: ex.signal.version != seen or ex.finished)
        ex.raise_if_failed()

    # ---- display ----------------------------------------------------------------------

    def _repr_html_(self) -> str:
        from sgdsl.notebook import render_html  # noqa: PLC0415

        return render_html(self.stream_executor)

    def display(self) -> Any:
        """Show the state in Jupyter and keep the view updated while the program streams."""
        from sgdsl.notebook import live_display  # noqa: PLC0415

        return live_display(self.stream_executor)

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class _Reader:
    """Incremental reads of the text or of one variable of a streaming state."""

    def __init__(self, ex: StateExecutor, var_name: str | None) -> None:
        self.ex, self.var, self.pos = ex, var_name, 0
        self.logprobs = 0  # output logprob entries already given with a read

    def meta(self) -> Any:
        """The variable's meta_info, with the logprob entries that came since the last read
        (read after the text, so it covers at least that text's tokens)."""
        meta, self.logprobs = since(self.ex.meta_info.get(self.var), self.logprobs)
        return meta

    def read(self) -> tuple[str, bool]:
        ex = self.ex
        if self.var is None:
            done = ex.finished
            text = ex.text_
        else:
            done = ex.finished or (self.var in ex.variables and not ex.pending.get(self.var))
            text = ex.variables.get(self.var, "")
            text = text if isinstance(text, str) else ""
        chunk, self.pos = text[self.pos:], len(text)
        return chunk, done


def _message_dict(message: Any) -> dict[str, Any]:
    if not message.images:
        return {"role": message.role, "content": message.content}
    from base64 import b64encode  # noqa: PLC0415

    parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}]
    for image in message.images:
        url = f"data:{image.mime_type};base64,{b64encode(image.data).decode()}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": message.role, "content": parts}


class ProgramStateGroup:
    """The states of a fork. ``forks += expr`` appends to each (a list: one item each; a
    callable: ``f(i)``); ``join()`` merges them back into the parent."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState) -> None:
        self.states, self.src_state = states, src_state

    def join(self, mode: str = "gather_variable") -> None:
        """``gather_variable``: each variable the forks created becomes a list in the parent.
        ``concate_and_append``: the forks' new texts are appended to the parent, in order."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"invalid join mode {mode!r}")
        for state in self.states:
            state.sync()
            state.stream_executor.raise_if_failed()
        parent = self.src_state.stream_executor
        for record in parent.forks:
            if record.children and record.children[0] is self.states[0].stream_executor:
                record.join_mode = mode
        if mode == "gather_variable":
            self._gather(parent)
        else:
            text = "".join(s.stream_executor.text_[s.stream_executor.fork_start:] for s in self.states)
            self.src_state += text
            self.src_state.sync()
        for state in self.states:
            state.stream_executor.end()

    def _gather(self, parent: StateExecutor) -> None:
        parent.sync()
        known = set(parent.variables)
        for state in self.states:
            child = state.stream_executor
            for name in child.variables.keys() - known:
                for store, source in ((parent.variables, child.variables), (parent.parsed, child.parsed),
                                      (parent.meta_info, child.meta_info)):
                    store.setdefault(name, []).append(source.get(name))

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        if self.states[i] is not value:  # `forks[i] += x` re-assigns the same state
            raise TypeError("cannot replace a forked state")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        for i, state in enumerate(self.states):
            if isinstance(other, (list, tuple)):
                state += other[i]
            elif callable(other) and not isinstance(other, ir.Node):
                state += other(i)
            else:
                state += other
        return self

"""Tracing: run a program's body against a recording state, without a backend.

Arguments are placeholders (``TraceArgument``) and generated variables are placeholders
(``TraceVariable``); appending them records a node. Using a placeholder as a Python value
(formatting it, iterating it, testing it) stops the trace there: what was recorded up to that
point is still a valid prefix. ``extract_prefix`` renders the constant text before the first
node that depends on arguments or generation, which ``SglFunction.cache`` sends to the
backend's prefix cache.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from sgdsl import ir
from sgdsl.role_methods import RoleMethods


class StopTracing(Exception):
    """Raised inside the traced body when it needs a value tracing cannot know."""


@dataclass(frozen=True)
class TracePlaceholder(ir.Node):
    name: str

    def _stop(self, *_: Any) -> Any:
        raise StopTracing(f"the program uses the value of {self.name!r}")

    __str__ = __format__ = __iter__ = __len__ = __bool__ = __int__ = __float__ = _stop
    __getitem__ = __lt__ = __gt__ = __contains__ = _stop


@dataclass(frozen=True)
class TraceArgument(TracePlaceholder):
    """A program argument."""


@dataclass(frozen=True)
class TraceVariable(TracePlaceholder):
    """A generated variable read back as ``s["x"]``."""


@dataclass
class TraceResult:
    nodes: list[ir.Node] = field(default_factory=list)
    complete: bool = True  # False when tracing stopped early
    stopped_because: str | None = None


class TracerState(RoleMethods):
    """Records what a program appends (the subset of ProgramState a body uses)."""

    def __init__(self, result: TraceResult) -> None:
        self.result = result
        self.ret_value: Any = None

    def __iadd__(self, other: Any) -> "TracerState":
        self.result.nodes.append(ir.as_node(other))
        return self

    def __getitem__(self, name: str) -> TraceVariable:
        return TraceVariable(name)

    def __setitem__(self, name: str, value: Any) -> None:
        pass

    def _role(self, role: str, expr: Any = None) -> Any:
        if expr is not None:
            self.result.nodes += [ir.RoleBegin(role), ir.as_node(expr), ir.RoleEnd(role)]
            return self
        return self._scope(ir.RoleBegin(role), ir.RoleEnd(role))

    @contextmanager
    def _scope(self, begin: ir.Node, end: ir.Node) -> Iterator[None]:
        self.result.nodes.append(begin)
        yield
        self.result.nodes.append(end)

    def var_scope(self, name: str) -> Any:
        return self._scope(ir.VarScopeBegin(name), ir.VarScopeEnd(name))

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> Any:
        raise StopTracing("the program forks")

    def _stop(self, *_: Any, **__: Any) -> Any:
        raise StopTracing("the program reads its own state")

    text = messages = sync = get_var = get_meta_info = copy = _stop


def trace_program(program: Any, kwargs: dict[str, Any] | None = None) -> TraceResult:
    """Trace ``program`` (an SglFunction); arguments not in ``kwargs`` become placeholders."""
    result = TraceResult()
    given = {**program.bind_arguments, **(kwargs or {})}
    args = {name: given.get(name, TraceArgument(name)) for name in program.arg_names}
    try:
        program.func(TracerState(result), **args)
    except StopTracing as stop:
        result.complete, result.stopped_because = False, str(stop)
    return result


def flatten(nodes: list[ir.Node]) -> list[ir.Node]:
    """Nodes with every (nested) ``Sequence`` expanded."""
    out: list[ir.Node] = []
    for node in nodes:
        out += flatten(list(node.items)) if isinstance(node, ir.Sequence) else [node]
    return out


def extract_prefix(program: Any, backend: Any) -> str:
    """The constant text the program starts with, rendered with the backend's chat template."""
    from sgdsl.chat_template import get_chat_template  # noqa: PLC0415

    template = backend.chat_template() or get_chat_template("default")
    flat = flatten(trace_program(program).nodes)
    out: list[str] = []
    seen_role = False
    for node in flat:
        if isinstance(node, ir.Text):
            out.append(node.value)
        elif isinstance(node, ir.RoleBegin):
            if not seen_role and node.role != "system" and template.default_system_prompt:
                prefix, suffix = template.get_prefix_and_suffix("system")
                out.append(prefix + template.default_system_prompt + suffix)
            seen_role = True
            out.append(template.get_prefix_and_suffix(node.role)[0])
        elif isinstance(node, ir.RoleEnd):
            out.append(template.get_prefix_and_suffix(node.role)[1])
        else:
            break
    return "".join(out)

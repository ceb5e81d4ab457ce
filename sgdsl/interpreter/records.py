"""Records of what a program did, kept on its state for inspection and for the notebook view:
``CallRecord`` per ``gen``/``select`` (variable, constraint, latency, the backend's meta_info:
finish reason, usage, cached tokens, logprobs, attempts of validate-and-retry, forced tokens) and
``ForkRecord`` per ``fork`` (the child states and how they were joined)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sgdsl import ir

if TYPE_CHECKING:
    from sgdsl.interpreter.executor import StateExecutor

_MAX_GRAMMAR_CHARS = 2000


@dataclass
class CallRecord:
    """Mutable while the call runs (the interpreter fills ``meta`` and ``latency_s``)."""

    kind: str  # "gen" or "select"
    name: str | None
    constraint: tuple[str, str] | None = None  # (kind, text) as the user gave it
    started: float = field(default_factory=time.perf_counter)
    latency_s: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def of(cls, node: ir.Gen | ir.Select) -> "CallRecord":
        if isinstance(node, ir.Select):
            return cls("select", node.name, ("choices", json.dumps(list(node.choices))))
        constraint = node.constraint
        if constraint is None:
            return cls("gen", node.name)
        return cls("gen", node.name, (constraint.kind, describe_value(constraint.value)))

    def finish(self, error: BaseException | None = None) -> None:
        self.latency_s = time.perf_counter() - self.started
        if error is not None:
            self.error = f"{type(error).__name__}: {error}"


def describe_value(value: Any) -> str:
    """A constraint's value as text (schemas as JSON, Pydantic models by their schema)."""
    if isinstance(value, str):
        text = value
    elif hasattr(value, "model_json_schema"):
        text = json.dumps(value.model_json_schema())
    elif isinstance(value, type):
        text = value.__name__
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= _MAX_GRAMMAR_CHARS else text[:_MAX_GRAMMAR_CHARS] + "…"


@dataclass
class ForkRecord:
    """The states one ``fork`` made; ``join_mode`` is set by ``join``."""

    children: list["StateExecutor"]
    join_mode: str | None = None

"""Tools in the language: ``gen(..., tools=[...], tool_choice=...)``.

A tool is a Python function (its signature and docstring give the JSON schema) or a JSON
schema dict (OpenAI's ``{"type": "function", "function": {...}}``, Anthropic's ``{"name",
"input_schema"}``, or ``{"name", "parameters"}``). The gen becomes a ``Constraint("tools",
ToolSet)`` that backends enforce natively: OpenAI and Anthropic as native tool calls, the
runtime backends as grammar-constrained calls. The calls land in ``state.tool_calls(name)``;
``run_tools`` executes them against the Python functions for a tool loop.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, get_type_hints

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean",
               list: "array", dict: "object"}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    parameters: dict[str, Any]
    description: str = ""
    fn: Callable[..., Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ToolSet:
    """``choice``: "auto" | "required" | "none"; ``forced``: the named tool, if any."""

    tools: tuple[ToolSpec, ...]
    choice: str = "auto"
    forced: str | None = None

    def names(self) -> tuple[str, ...]:
        return (self.forced,) if self.forced else tuple(t.name for t in self.tools)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


def tool_spec(tool: Any) -> ToolSpec:
    """A ToolSpec from a function, a ToolSpec, or an OpenAI/Anthropic-style dict."""
    if isinstance(tool, ToolSpec):
        return tool
    if isinstance(tool, dict):
        fn = tool.get("function") if tool.get("type") == "function" else tool
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"a tool dict needs a name: {tool!r}")
        params = fn.get("parameters", fn.get("input_schema")) or {"type": "object"}
        return ToolSpec(fn["name"], params, fn.get("description") or "")
    if callable(tool):
        return ToolSpec(tool.__name__, _signature_schema(tool),
                        inspect.getdoc(tool) or "", fn=tool)
    raise TypeError(f"a tool is a function or a JSON schema dict, not {type(tool).__name__}")


def _signature_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    hints = get_type_hints(fn)
    props: dict[str, Any] = {}
    required = []
    for name, p in inspect.signature(fn).parameters.items():
        kind = _JSON_TYPES.get(getattr(hints.get(name), "__origin__", hints.get(name)))
        props[name] = {"type": kind} if kind else {}
        if p.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def tool_set(tools: Sequence[Any], tool_choice: Any = None) -> ToolSet:
    specs = tuple(tool_spec(t) for t in tools)
    names = [t.name for t in specs]
    if not specs or len(set(names)) != len(names):
        raise ValueError("tools must be a non-empty list with unique names")
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):  # OpenAI {"type": "function", "function": {"name"}}
        choice = (choice.get("function") or {}).get("name") or choice.get("name")
    if choice in ("auto", "required", "none"):
        return ToolSet(specs, choice)
    if choice not in names:
        raise ValueError(f"tool_choice names an unknown tool {choice!r}; tools: {names}")
    return ToolSet(specs, "required", choice)


def calls_of(meta: Any) -> list[ToolCall]:
    """The calls a backend reported in a gen's meta_info."""
    out = []
    for c in (meta or {}).get("tool_calls") or []:
        args = c.get("arguments", {})
        out.append(ToolCall(c["name"], json.loads(args) if isinstance(args, str) else args,
                            c.get("id", "")))
    return out


def run_tools(calls: Sequence[ToolCall], tools: Sequence[Any]) -> list[Any]:
    """Run each call with its Python function; a failing call gives the exception's text."""
    fns = {s.name: s.fn for s in map(tool_spec, tools) if s.fn is not None}
    results = []
    for call in calls:
        fn = fns.get(call.name)
        if fn is None:
            raise ValueError(f"no Python function for tool {call.name!r}")
        try:
            results.append(fn(**call.arguments))
        except Exception as exc:  # the model sees the failure and may retry
            results.append(f"error: {type(exc).__name__}: {exc}")
    return results


def render_calls(calls: Sequence[ToolCall]) -> str:
    """The calls as text in the transcript (Hermes style, which most templates understand)."""
    return "\n".join("<tool_call>\n" + json.dumps({"name": c.name, "arguments": c.arguments},
                                                    ensure_ascii=False) + "\n</tool_call>"
                     for c in calls)


def tool_results(calls: Sequence[ToolCall], tools: Sequence[Any]) -> str:
    """Run the calls and format their results for the next user turn."""
    results = run_tools(calls, tools)
    return "\n".join("<tool_response>\n" + json.dumps({"name": c.name, "result": r},
                                                        ensure_ascii=False, default=str)
                     + "\n</tool_response>" for c, r in zip(calls, results))

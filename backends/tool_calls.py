"""``Constraint("tools", ToolSet)`` in each API's own spelling, and the calls back out of
their responses as ``meta_info["tool_calls"]`` (``{"id", "name", "arguments"}`` dicts, the
arguments as JSON text), the shape ``sgdsl.tools.calls_of`` reads."""
from __future__ import annotations

import json
from typing import Any

from sgdsl.tools import ToolSet


def openai_tools(tools: ToolSet) -> dict[str, Any]:
    req: dict[str, Any] = {"tools": [
        {"type": "function", "function": {"name": t.name, "description": t.description,
                                          "parameters": t.parameters}} for t in tools.tools]}
    if tools.forced:
        req["tool_choice"] = {"type": "function", "function": {"name": tools.forced}}
    else:
        req["tool_choice"] = tools.choice
    return req


def openai_calls(message: Any) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments or "{}"}
            for c in (getattr(message, "tool_calls", None) or [])]


def anthropic_tools(tools: ToolSet) -> dict[str, Any]:
    req: dict[str, Any] = {"tools": [
        {"name": t.name, "description": t.description, "input_schema": t.parameters}
        for t in tools.tools]}
    if tools.forced:
        req["tool_choice"] = {"type": "tool", "name": tools.forced}
    else:
        req["tool_choice"] = {"type": {"required": "any"}.get(tools.choice, tools.choice)}
    return req


def anthropic_calls(resp: Any) -> list[dict[str, Any]]:
    return [{"id": b.id, "name": b.name, "arguments": json.dumps(b.input)}
            for b in resp.content if b.type == "tool_use"]

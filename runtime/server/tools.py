"""Tool calls as constrained generation: the model must emit JSON that matches a tool's input
schema, enforced by the engine's ``json_schema`` grammar. Shared by the OpenAI and Anthropic
protocols, which only differ in how tools and tool choices are spelled."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from .errors import APIError


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class ToolPlan:
    """How a request uses its tools: ``json_schema`` to constrain the output with, and
    whether the output names the tool (several candidates) or is the forced tool's input."""

    tools: tuple[Tool, ...]
    forced: str | None  # the one tool the output is the input of; None: {"name", "input"}

    @property
    def json_schema(self) -> str:
        if self.forced is not None:
            return json.dumps(self._tool(self.forced).schema)
        options = [{"type": "object",
                    "properties": {"name": {"const": t.name}, "input": t.schema},
                    "required": ["name", "input"], "additionalProperties": False}
                   for t in self.tools]
        return json.dumps(options[0] if len(options) == 1 else {"anyOf": options})

    def parse(self, text: str) -> tuple[str, Any]:
        """(tool name, parsed input) from the generated text; 500-free: text that is not
        valid JSON (e.g. cut by max_tokens) is returned as the raw string."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return (self.forced or self.tools[0].name), text
        if self.forced is not None:
            return self.forced, value
        if isinstance(value, dict) and "name" in value:
            return str(value["name"]), value.get("input", {})
        return self.tools[0].name, value

    def _tool(self, name: str) -> Tool:
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise APIError(400, f"tool_choice names an unknown tool '{name}'", param="tool_choice")


def plan_tools(tools: Sequence[Tool], mode: str, forced: str | None = None) -> ToolPlan | None:
    """``mode``: "none" (ignore tools), "auto", "any" (must call one), "tool" (must call
    ``forced``). "auto" cannot be honoured by a constraint (the model may or may not call a
    tool), so it is refused rather than silently turned into either."""
    if not tools or mode == "none":
        return None
    if mode == "auto":
        raise APIError(400, "tool_choice 'auto' is not supported; force a tool "
                            "(a named tool, or 'any'/'required')", param="tool_choice")
    if mode == "tool":
        plan = ToolPlan(tuple(tools), forced)
        plan._tool(forced or "")
        return plan
    return ToolPlan(tuple(tools), tools[0].name if len(tools) == 1 else None)

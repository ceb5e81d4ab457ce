"""Tool calling, shared by the OpenAI and Anthropic protocols (which only differ in how tools,
choices, calls and results are spelled): the request's tools and choice as a ``ToolPlan``, and
the prompt with the tools in it.

The prompt uses the model's own chat template with its ``tools`` support. A template without
it (the embedded SmolLM2's, plain ChatML) gets the documented fallback: a system message that
lists the tools' JSON schemas and asks for Hermes-style ``<tool_call>`` blocks, assistant calls
in the history written as such blocks, and tool results as ``<tool_response>`` user turns.

How the answer is generated from a plan is ``tool_turn.py``'s job.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..function_call import ToolCall, ToolCallFormat, template_supports_tools
from ..function_call.prompt import tool_system_prompt
from .chat import ChatTemplate
from .errors import APIError


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]
    description: str = ""

    def as_openai(self) -> dict[str, Any]:
        """The shape chat templates (and OpenAI) take in ``tools``."""
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolPlan:
    """``mode``: "none" (tools ignored), "auto" (the model decides; a call it opens is then
    grammar-constrained), "required" (a call to one of ``allowed`` is forced from the start)."""

    tools: tuple[Tool, ...]
    mode: str
    fmt: ToolCallFormat
    allowed: tuple[str, ...] = ()  # the tools a call may name (all, or the named one)
    parallel: bool = False  # several constrained calls in one turn (asked for explicitly)

    @property
    def active(self) -> bool:
        return self.mode != "none" and bool(self.tools)

    def call_schema(self) -> str:
        """JSON schema of one call (name first, then the tool's own arguments schema)."""
        by_name = {t.name: t for t in self.tools}
        return json.dumps(self.fmt.call_schema(
            [(n, by_name[n].parameters) for n in self.allowed]))


def plan_tools(tools: Sequence[Tool], mode: str, fmt: ToolCallFormat, forced: str | None = None,
               parallel: bool = False) -> ToolPlan | None:
    """``mode``: "none", "auto", "required" (any tool), "named" (``forced``). None when the
    request has no tools; a choice that needs tools without any is a 400."""
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tool names must be unique", param="tools")
    if not tools:
        if mode in ("required", "named"):
            raise APIError(400, "tool_choice requires tools", param="tool_choice")
        return None
    if mode == "named":
        if forced not in names:
            raise APIError(400, f"tool_choice names an unknown tool '{forced}'",
                           param="tool_choice")
        return ToolPlan(tuple(tools), "required", fmt, (forced,), parallel)
    return ToolPlan(tuple(tools), mode, fmt, tuple(names), parallel)


def render_prompt(template: ChatTemplate, messages: list[dict[str, Any]],
                  plan: ToolPlan | None) -> str:
    """The prompt for ``messages`` (template dicts: ``tool_calls`` as ToolCall lists on
    assistant turns, ``tool`` role for results) with the plan's tools offered."""
    fmt = plan.fmt if plan is not None else None
    tools = [t.as_openai() for t in plan.tools] if plan is not None and plan.active else None
    if template_supports_tools(template.source):
        return template.render([_hf_message(m) for m in messages],
                               **({"tools": tools} if tools else {}))
    return template.render(_fallback_messages(messages, tools, fmt))


def _hf_message(m: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face's message shape: tool_calls with dict arguments."""
    calls: list[ToolCall] = m.get("tool_calls") or []
    if not calls:
        return m
    return {**m, "tool_calls": [{"type": "function", "id": c.id,
                                 "function": {"name": c.name, "arguments": c.input}}
                                for c in calls]}


def _fallback_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       fmt: ToolCallFormat | None) -> list[dict[str, Any]]:
    from ..function_call import get_format

    fmt = fmt or get_format("hermes")
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool"):  # consecutive results: one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        elif m.get("tool_calls"):
            text = (m.get("content") or "")
            calls = fmt.render_calls(m["tool_calls"])
            out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    out = [{k: v for k, v in m.items() if k != "_tool"} for m in out]
    if tools:
        system = tool_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out

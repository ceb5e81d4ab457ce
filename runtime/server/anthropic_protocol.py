"""Anthropic Messages request bodies (pydantic) and their translation to a chat prompt and
runtime sampling params."""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..function_call import ToolCall, ToolCallFormat
from .errors import APIError
from .tools import Tool, ToolPlan, plan_tools


class ContentBlock(BaseModel):
    """A content block: text, tool_use, tool_result and thinking are understood (earlier
    thinking is not shown to the model again), others refused."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: Optional[str] = None
    id: Optional[str] = None
    name: Optional[str] = None
    input: Any = None
    tool_use_id: Optional[str] = None
    content: Any = None

    def as_text(self) -> str:
        if self.type == "text":
            return self.text or ""
        if self.type in ("thinking", "redacted_thinking"):
            return ""
        raise APIError(400, f"content block type '{self.type}' is not supported here",
                       param="messages")

    def result_text(self) -> str:
        if isinstance(self.content, list):
            return "".join(b.get("text", "") for b in self.content if isinstance(b, dict))
        return str(self.content or "")

    def as_call(self) -> ToolCall:
        if not self.name or not isinstance(self.input, dict):
            raise APIError(400, "tool_use blocks need a name and an input object",
                           param="messages")
        return ToolCall(self.name, json.dumps(self.input), self.id or "")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: Union[str, list[ContentBlock]]

    def template_messages(self, images: Any = None, where: str = "messages"
                          ) -> list[dict[str, Any]]:
        """Template dicts: tool results as ``tool`` turns first, calls on the assistant turn;
        ``images`` (mm: an ``ImageCollector``) takes ``image`` blocks."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        out: list[dict[str, Any]] = [
            {"role": "tool", "content": b.result_text(), "tool_call_id": b.tool_use_id or ""}
            for b in self.content if b.type == "tool_result"]
        calls = [b.as_call() for b in self.content if b.type == "tool_use"]
        text = "".join(images.anthropic_block(getattr(b, "source", None), f"{where}.content[{j}]")
                       if b.type == "image" and images is not None else b.as_text()  # mm:
                       for j, b in enumerate(self.content)
                       if b.type not in ("tool_result", "tool_use"))
        if text or calls or not out:
            out.append({"role": self.role, "content": text, **({"tool_calls": calls} if calls
                                                              else {})})
        return out


class MessagesRequest(BaseModel):
    """``POST /v1/messages``."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: Union[str, list[ContentBlock], None] = None
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=1)
    stream: bool = False
    metadata: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    service_tier: Optional[str] = None
    thinking: Optional[dict[str, Any]] = None  # {"type": "disabled"} turns separation off

    def chat_messages(self, images: Any = None) -> list[dict[str, Any]]:
        """OpenAI-style role/content dicts for the chat template, system first."""
        out: list[dict[str, Any]] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(
                block.as_text() for block in self.system)
            out.append({"role": "system", "content": system})
        for i, m in enumerate(self.messages):
            out.extend(m.template_messages(images, f"messages[{i}]"))
        return out

    @property
    def wants_thinking(self) -> bool:
        return (self.thinking or {}).get("type") != "disabled"

    @property
    def prefilled(self) -> bool:
        """A final assistant message is a prefill: the answer continues it."""
        return self.messages[-1].role == "assistant"

    def sampling(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "stop": self.stop_sequences}

    def tool_plan(self, fmt: ToolCallFormat) -> ToolPlan | None:
        tools = []
        for t in self.tools or []:
            if "name" not in t or not isinstance(t.get("input_schema", {}), dict):
                raise APIError(400, "tools need a name and an input_schema object",
                               param="tools")
            tools.append(Tool(t["name"], t.get("input_schema") or {"type": "object"},
                              t.get("description") or ""))
        choice = self.tool_choice or {"type": "auto"}
        mode = choice.get("type")
        modes = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
        if mode not in modes:
            raise APIError(400, f"invalid tool_choice type '{mode}'", param="tool_choice")
        return plan_tools(tools, modes[mode], fmt, choice.get("name"),
                          parallel=choice.get("disable_parallel_tool_use") is False)

"""Anthropic Messages request bodies (pydantic) and their translation to a chat prompt and
runtime sampling params."""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from .errors import APIError
from .tools import Tool, ToolPlan, plan_tools


class ContentBlock(BaseModel):
    """A content block; text, tool_use and tool_result are understood, others refused."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: Optional[str] = None
    name: Optional[str] = None
    input: Any = None
    content: Any = None

    def as_text(self) -> str:
        if self.type == "text":
            return self.text or ""
        if self.type == "tool_use":
            return json.dumps({"name": self.name, "input": self.input})
        if self.type == "tool_result":
            if isinstance(self.content, list):
                return "".join(b.get("text", "") for b in self.content if isinstance(b, dict))
            return str(self.content or "")
        raise APIError(400, f"content block type '{self.type}' is not supported",
                       param="messages")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: Union[str, list[ContentBlock]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(block.as_text() for block in self.content)


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

    def chat_messages(self) -> list[dict[str, str]]:
        """OpenAI-style role/content dicts for the chat template, system first."""
        out = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(
                block.as_text() for block in self.system)
            out.append({"role": "system", "content": system})
        out.extend({"role": m.role, "content": m.text()} for m in self.messages)
        return out

    @property
    def prefilled(self) -> bool:
        """A final assistant message is a prefill: the answer continues it."""
        return self.messages[-1].role == "assistant"

    def sampling(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "stop": self.stop_sequences}

    def tool_plan(self) -> ToolPlan | None:
        tools = []
        for t in self.tools or []:
            if "name" not in t or not isinstance(t.get("input_schema", {}), dict):
                raise APIError(400, "tools need a name and an input_schema object",
                               param="tools")
            tools.append(Tool(t["name"], t.get("input_schema") or {"type": "object"}))
        choice = self.tool_choice or {"type": "auto"}
        mode = choice.get("type")
        if mode not in ("auto", "any", "tool", "none"):
            raise APIError(400, f"invalid tool_choice type '{mode}'", param="tool_choice")
        return plan_tools(tools, mode, choice.get("name"))

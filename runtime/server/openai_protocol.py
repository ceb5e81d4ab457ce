"""OpenAI request bodies (pydantic) and their translation to runtime sampling params.

Unknown fields are refused (400 naming the field) rather than silently ignored; fields that
only matter to the hosted service (``user``, ``metadata``, ``store``...) are accepted and
ignored. SGLang's extensions (``top_k``, ``min_p``, ``regex``...) are accepted as well, so
``extra_body`` works as it does against SGLang.
"""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from .errors import APIError
from ..function_call import ToolCall, ToolCallFormat
from .tools import Tool, ToolPlan, plan_tools


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[dict[str, Any]] = None


class _SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, float]] = None
    response_format: Optional[ResponseFormat] = None
    user: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None
    # SGLang extensions (extra_body)
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: Optional[int] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[int]] = None
    stop_regex: Union[str, list[str], None] = None
    skip_special_tokens: Optional[bool] = None
    no_stop_trim: Optional[bool] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    json_schema: Union[str, dict[str, Any], None] = None

    def sampling(self, max_new_tokens: int) -> dict[str, Any]:
        """Runtime sampling params (nulls mean "default" and are dropped downstream)."""
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        schema = self.json_schema
        if isinstance(schema, dict):
            schema = json.dumps(schema)
        schema = _schema_of(self.response_format) or schema
        return {
            "max_new_tokens": max_new_tokens, "min_new_tokens": self.min_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "min_p": self.min_p, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty, "stop": self.stop,
            "stop_regex": self.stop_regex,
            "stop_token_ids": self.stop_token_ids, "seed": self.seed,
            "ignore_eos": self.ignore_eos, "skip_special_tokens": self.skip_special_tokens,
            "no_stop_trim": self.no_stop_trim, "regex": self.regex, "ebnf": self.ebnf,
            "json_schema": schema,
        }

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


def _schema_of(fmt: ResponseFormat | None) -> str | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json.dumps({"type": "object"})
    spec = fmt.json_schema or {}
    schema = spec.get("schema", spec.get("schema_"))
    if not isinstance(schema, dict):
        raise APIError(400, "response_format.json_schema.schema must be an object",
                       param="response_format")
    return json.dumps(schema)


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int] = Field(16, ge=0)
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError(400, "prompt must not be empty", param="prompt")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def check_unsupported(self) -> None:
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise APIError(400, "best_of other than n is not supported", param="best_of")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None

    def as_template_message(self, images: Any = None, where: str = "messages") -> dict[str, Any]:
        """role + plain string content, as chat templates expect; ``images`` (mm: an
        ``ImageCollector``) takes ``image_url`` parts, leaving the model's placeholder."""
        role = "system" if self.role == "developer" else self.role
        if isinstance(self.content, list):
            texts = []
            for j, part in enumerate(self.content):
                if part.type == "image_url" and images is not None:  # mm:
                    texts.append(images.openai_part(part, f"{where}.content[{j}].image_url"))
                    continue
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"content part type '{part.type}' is not supported",
                                   param="messages")
                texts.append(part.text)
            content = "".join(texts)
        else:
            content = self.content or ""
        out: dict[str, Any] = {"role": role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [_history_call(c) for c in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id or ""
            if self.name:
                out["name"] = self.name
        return out


def _history_call(call: dict[str, Any]) -> ToolCall:
    """An assistant's earlier call, as sent back in the history."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise APIError(400, "tool_calls entries must be {'type': 'function', 'function': "
                            "{'name': ..., 'arguments': ...}}", param="messages")
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        args = json.dumps(args)
    try:
        if not isinstance(json.loads(args or "{}"), dict):
            raise ValueError
    except ValueError:
        raise APIError(400, f"arguments of the earlier call to '{fn['name']}' are not a JSON "
                            "object", param="messages") from None
    return ToolCall(fn["name"], args or "{}", str(call.get("id") or ""))


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=0)
    max_completion_tokens: Optional[int] = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    separate_reasoning: bool = True  # SGLang extension: reasoning_content apart (with a parser)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens

    def tool_plan(self, fmt: ToolCallFormat) -> ToolPlan | None:
        tools = []
        for t in self.tools or []:
            fn = t.get("function") if isinstance(t, dict) else None
            if t.get("type") != "function" or not isinstance(fn, dict) or "name" not in fn:
                raise APIError(400, "tools must be {'type': 'function', 'function': {...}}",
                               param="tools")
            params = fn.get("parameters") or {"type": "object"}
            if not isinstance(params, dict):
                raise APIError(400, f"parameters of tool '{fn['name']}' must be a JSON schema "
                                    "object", param="tools")
            tools.append(Tool(fn["name"], params, fn.get("description") or ""))
        choice = self.tool_choice if self.tool_choice is not None else "auto"
        parallel = self.parallel_tool_calls is True
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            return plan_tools(tools, "named", fmt, name, parallel)
        if choice not in ("none", "auto", "required"):
            raise APIError(400, f"invalid tool_choice '{choice}'", param="tool_choice")
        return plan_tools(tools, choice, fmt, parallel=parallel)

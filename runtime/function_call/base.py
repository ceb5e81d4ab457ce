"""Tool-call formats: how a model family writes a tool call in its output, how to find the
calls in generated text, and what a forced call looks like to the grammar.

One ``ToolCallFormat`` per family (``hermes.py``: Qwen2.5/3, Hermes ``<tool_call>`` JSON;
``llama3.py``: Llama-3.x JSON / ``<|python_tag|>``; ``mistral.py``: ``[TOOL_CALLS]``), chosen from
the chat template or by name (``registry.py``).

Parsing never invents a call and never loses text: a block that is not a well-formed call
(bad JSON, no name, cut short by max_tokens) stays in ``normal_text`` exactly as generated.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``arguments`` is a JSON object's text (as the OpenAI API carries it)."""

    name: str
    arguments: str = "{}"
    id: str = ""  # the protocol's call id, where one is known (history)

    @property
    def input(self) -> Any:
        """The arguments as a value (Anthropic's ``input``)."""
        return json.loads(self.arguments)


@dataclass(frozen=True)
class ParseResult:
    normal_text: str
    calls: tuple[ToolCall, ...] = field(default_factory=tuple)


class ToolCallFormat(ABC):
    """A family's call syntax. ``opener``: the text that starts a call section (generation
    stops there so the call itself can be grammar-constrained); ``forced_prefix``: what the
    prompt gets before a constrained call; ``args_key``: the arguments' key in the call JSON."""

    name: str = ""
    opener: str = ""
    forced_prefix: str = ""
    args_key: str = "arguments"
    closer: str = ""  # what ends one call before the next (formats with one block per call)

    @abstractmethod
    def parse(self, text: str) -> ParseResult:
        """Split generated text into normal text and well-formed calls."""

    def call_schema(self, tools: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """JSON schema of one call object of ``tools`` ((name, parameters schema) pairs),
        ``name`` first so that the name is known before the arguments stream."""
        options = [{"type": "object",
                    "properties": {"name": {"const": name}, self.args_key: schema or {}},
                    "required": ["name", self.args_key], "additionalProperties": False}
                   for name, schema in tools]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def call_from_value(self, value: Any) -> ToolCall | None:
        """A call from a decoded JSON value, or None if it is not one."""
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        if not value["name"]:
            return None
        args = value.get(self.args_key, value.get("arguments", value.get("parameters", {})))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall(value["name"], json.dumps(args, ensure_ascii=False))

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        """The calls as this family writes them (for history without template support)."""
        return "".join(f"{self.opener}{json.dumps(self._call_dict(c), ensure_ascii=False)}"
                       for c in calls)

    def _call_dict(self, call: ToolCall) -> dict[str, Any]:
        return {"name": call.name, self.args_key: call.input}


def decode_json_prefix(text: str) -> tuple[Any, int] | None:
    """(value, end index) of the JSON value at the start of ``text`` (after whitespace)."""
    stripped = len(text) - len(text.lstrip())
    try:
        value, end = json.JSONDecoder().raw_decode(text, stripped)
    except json.JSONDecodeError:
        return None
    return value, end

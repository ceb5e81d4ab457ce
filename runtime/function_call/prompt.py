"""The tool listing for prompts whose chat template has no tool support (the documented
fallback of docs/tools.md): the tools' JSON schemas and the Hermes call syntax, as a system
message. Shared by the server and the language's runtime backends."""
from __future__ import annotations

import json
from typing import Any, Sequence

FALLBACK_SYSTEM = (
    "You may call one or more functions to assist with the user query. The function "
    "signatures are inside <tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call a function, "
    "answer with a JSON object with the function name and arguments inside <tool_call></tool_call>:"
    '\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def tool_system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """``tools`` in OpenAI's shape (``{"type": "function", "function": {...}}``)."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return FALLBACK_SYSTEM.format(tools=listing)

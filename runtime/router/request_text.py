"""The text a policy routes on, from any protocol's request body: the prompt as the worker
will see it, up to its chat template (the messages' text in order is enough for prefix
affinity: requests sharing a system prompt share this text's prefix too), and the request's
output budget."""
from __future__ import annotations

import re
from typing import Any

_PROMPT_TOKENS = re.compile(rb'"(?:prompt_tokens|input_tokens)"\s*:\s*(\d+)')


def routing_text(path: str, body: dict[str, Any]) -> str:
    if path == "/generate":
        return _generate_text(body)
    if path == "/v1/completions":
        return _prompt_text(body.get("prompt"))
    if path == "/v1/chat/completions":
        return _messages_text(body.get("messages"))
    if path == "/v1/messages":
        return _content_text(body.get("system")) + _messages_text(body.get("messages"))
    return ""


def _generate_text(body: dict[str, Any]) -> str:
    text = body.get("text")
    if text is not None:
        return _prompt_text(text)
    return _prompt_text(body.get("input_ids"))


def _prompt_text(prompt: Any) -> str:
    """A string, a batch of strings, token ids or a batch of them: a batch routes on its first
    prompt (one worker serves the whole batch)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, (str, list)):
            return _prompt_text(first)
        # Token ids: their decimal text keeps the prefix relation between prompts.
        return " ".join(str(t) for t in prompt) + " "
    return ""


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        if isinstance(message, dict):
            parts.append(f"<{message.get('role', '')}>{_content_text(message.get('content'))}")
    return "".join(parts)


def _content_text(content: Any) -> str:
    """OpenAI/Anthropic content: a string or a list of blocks (only text blocks count)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def output_budget(path: str, body: dict[str, Any]) -> int:
    """The most tokens the request may generate, as its body says (0: not said), for a policy
    that estimates each request's work."""
    if path == "/generate":
        params = body.get("sampling_params")
        if isinstance(params, list):
            params = params[0] if params else None
        value = params.get("max_new_tokens") if isinstance(params, dict) else None
    else:
        value = body.get("max_completion_tokens") or body.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def answered_prompt_tokens(body: bytes) -> int:
    """The prompt's token count a worker's JSON answer reports (native ``meta_info``, OpenAI
    ``usage``, Anthropic ``usage``), found without parsing the body; 0 if absent."""
    found = _PROMPT_TOKENS.search(body)
    return int(found.group(1)) if found else 0

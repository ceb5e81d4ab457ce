"""The text a policy routes on, from any protocol's request body: the prompt as the worker
will see it, up to its chat template (the messages' text in order is enough for prefix
affinity: requests sharing a system prompt share this text's prefix too)."""
from __future__ import annotations

from typing import Any


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

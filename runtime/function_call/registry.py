"""Tool-call formats by name (``--tool-call-parser``) or detected from a chat template."""
from __future__ import annotations

from .base import ToolCallFormat
from .hermes import HermesFormat
from .llama3 import Llama3Format
from .mistral import MistralFormat

FORMATS: dict[str, type[ToolCallFormat]] = {
    "hermes": HermesFormat, "qwen": HermesFormat, "qwen25": HermesFormat, "qwen3": HermesFormat,
    "llama3": Llama3Format, "mistral": MistralFormat,
}


def get_format(name: str) -> ToolCallFormat:
    """The format called ``name``; a ValueError lists the known names."""
    try:
        return FORMATS[name]()
    except KeyError:
        raise ValueError(f"unknown tool call parser {name!r}; known: "
                         f"{', '.join(sorted(FORMATS))}") from None


def template_supports_tools(source: str | None) -> bool:
    """Whether a chat template renders a ``tools`` list itself."""
    return bool(source) and "tools" in source


def detect_format(source: str | None) -> ToolCallFormat:
    """The family a chat template's markers point to; Hermes (the fallback prompt's own
    format) when the template names none."""
    text = source or ""
    if "[TOOL_CALLS]" in text or "[AVAILABLE_TOOLS]" in text:
        return MistralFormat()
    if "<|python_tag|>" in text or "ipython" in text:
        return Llama3Format()
    return HermesFormat()

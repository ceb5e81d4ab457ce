"""Tool calls in generated text: per-family formats and parsers (see ``base.py``)."""
from .base import ParseResult, ToolCall, ToolCallFormat
from .registry import FORMATS, detect_format, get_format, template_supports_tools

__all__ = ["FORMATS", "ParseResult", "ToolCall", "ToolCallFormat", "detect_format",
           "get_format", "template_supports_tools"]

"""Reasoning sections (``--reasoning-parser``): the ``<think>...</think>`` part of a reasoning
model's answer, separated from the answer itself.

- ``qwen3``: the model opens ``<think>`` itself, or answers without thinking;
- ``deepseek-r1``: the template already opened the section, so the output starts inside it
  (a leading ``<think>`` is tolerated) and everything before ``</think>`` is reasoning.
"""
from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    always_thinks: bool  # output starts inside the section (no <think> needed)
    start: str = START
    end: str = END

    def splitter(self) -> "ReasoningSplitter":
        return ReasoningSplitter(self)

    def empty_section(self) -> str:
        """Text that closes the section at once (for an answer that must follow a grammar)."""
        return f"{self.start}\n\n{self.end}\n\n"

    def text_of_unclosed(self, raw: str) -> str:
        """The reasoning of an output that never closed its section."""
        return _strip_start(raw, self.start)


REASONING_FORMATS = {"qwen3": ReasoningFormat("qwen3", always_thinks=False),
                     "deepseek-r1": ReasoningFormat("deepseek-r1", always_thinks=True)}


def get_reasoning_format(name: str | None) -> ReasoningFormat | None:
    if name is None:
        return None
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: "
                         f"{', '.join(sorted(REASONING_FORMATS))}") from None


class ReasoningSplitter:
    """Streaming: text of the section as it arrives (the start tag and the whitespace around
    it dropped). ``thinking`` is None until the output shows whether it thinks at all."""

    def __init__(self, fmt: ReasoningFormat) -> None:
        self.fmt = fmt
        self._raw = ""
        self._sent = 0
        self.thinking: bool | None = True if fmt.always_thinks else None

    @property
    def text(self) -> str:
        return _strip_start(self._raw, self.fmt.start).strip()

    def push(self, delta: str) -> str:
        self._raw += delta
        head = self._raw.lstrip()
        if len(head) < len(self.fmt.start) and self.fmt.start.startswith(head):
            return ""  # may still become the start tag
        if self.thinking is None:
            self.thinking = head.startswith(self.fmt.start)
        if not self.thinking:
            return ""
        body = _strip_start(self._raw, self.fmt.start).lstrip()
        # NOTE: trailing whitespace is held back: it is dropped if the section ends here.
        end = len(body.rstrip())
        piece = body[self._sent:end]
        self._sent = max(self._sent, end)
        return piece


def _strip_start(raw: str, start: str) -> str:
    head = raw.lstrip()
    return head[len(start):] if head.startswith(start) else raw

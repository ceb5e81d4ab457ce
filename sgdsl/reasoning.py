"""Reasoning sections in generated text (SGLang's ``separate_reasoning``): the
``<think>...</think>`` part of a reasoning model's output apart from the answer.

``model_type`` as in SGLang: ``deepseek-r1`` (the template opens the section, so the output
starts inside it), ``qwen3`` and the others that open ``<think>`` themselves (an output that
does not start with it has no reasoning).
"""
from __future__ import annotations

START, END = "<think>", "</think>"
# Families whose chat template opens the section (the output begins inside it).
_STARTS_INSIDE = frozenset({"deepseek-r1", "deepseek-v3", "kimi", "glm45"})
MODEL_TYPES = frozenset({"qwen3", "qwen3-thinking", "deepseek-r1", "deepseek-v3", "kimi",
                         "glm45", "step3", "minimax"})


def check_model_type(model_type: str | None) -> str:
    model_type = model_type or "deepseek-r1"
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown reasoning model_type {model_type!r}; known: "
                         f"{', '.join(sorted(MODEL_TYPES))}")
    return model_type


class ReasoningSplitter:
    """Streaming split: ``push(delta) -> (reasoning piece, answer piece)``; ``finish()`` the
    rest. Text that could still be the start or end tag is held back until it is known."""

    def __init__(self, model_type: str | None) -> None:
        self.model_type = check_model_type(model_type)
        self._buf = ""
        self._state = "think" if self.model_type in _STARTS_INSIDE else "start"
        self.reasoning = ""
        self.answer = ""

    def push(self, delta: str) -> tuple[str, str]:
        self._buf += delta
        before = (len(self.reasoning), len(self.answer))
        while self._step():
            pass
        return self.reasoning[before[0]:], self.answer[before[1]:]

    def finish(self) -> tuple[str, str]:
        before = (len(self.reasoning), len(self.answer))
        if self._state == "answer" or (self._state == "start" and not self._buf.strip()):
            self.answer += self._buf
        elif self._state == "start":  # a bare "<thi": an answer after all
            self.answer += self._buf
        else:  # a section that never closed: all of it is reasoning
            rest = self._buf.rstrip()
            self.reasoning += rest.lstrip() if not self.reasoning else rest
        self._buf = ""
        return self.reasoning[before[0]:], self.answer[before[1]:]

    def _step(self) -> bool:
        buf = self._buf
        if self._state == "start":
            head = buf.lstrip()
            if len(head) < len(START) and START.startswith(head):
                return False
            self._state = "think" if head.startswith(START) else "answer"
            if self._state == "think":
                self._buf = head[len(START):]
            return True
        if self._state == "think":
            end = buf.find(END)
            if end >= 0:
                piece = buf[:end].rstrip()
                self.reasoning += piece.lstrip() if not self.reasoning else piece
                self._buf, self._state = buf[end + len(END):], "answer"
                return True
            # NOTE: trailing whitespace and a possible partial end tag wait for more text.
            cut = len(buf) - _partial_suffix(buf, END)
            cut = len(buf[:cut].rstrip())
            piece = buf[:cut]
            if not self.reasoning:
                piece = piece.lstrip()
            self.reasoning += piece
            self._buf = buf[cut:]
            return False
        if not self.answer:  # the answer's leading whitespace is not content
            buf = buf.lstrip()
        self.answer += buf
        self._buf = ""
        return False


def split_reasoning(text: str, model_type: str | None) -> tuple[str, str]:
    """(reasoning, answer) of a complete output."""
    splitter = ReasoningSplitter(model_type)
    splitter.push(text)
    splitter.finish()
    return splitter.reasoning, splitter.answer


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0

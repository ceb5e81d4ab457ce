"""Incremental detokenization: turn a growing list of output token ids into text deltas.

Decoding the whole output at every step is O(n) per token. Like vLLM and SGLang we keep two
offsets into the ids: ``prefix_offset`` (start of a short context window, already emitted) and
``read_offset`` (end of what has been emitted). Each step decodes only ``ids[prefix_offset:]`` and
``ids[prefix_offset:read_offset]``; the difference is the new text. Decoding from a little context
before the new tokens keeps tokenizers that strip a leading space (SentencePiece) correct.

A byte-level BPE token can carry part of a multi-byte UTF-8 character (emoji, CJK); decoding it
alone gives U+FFFD. While the window's text ends in U+FFFD the delta is held back and the window
grows, until the character is complete. ``flush`` emits whatever remains at the end, so the
concatenated deltas equal ``tokenizer.decode(all_ids)`` for tokenizers whose decoding is local
(byte-level BPE without clean-up of tokenization spaces, as SmolLM2/Llama-3/Qwen).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

_REPLACEMENT = "\ufffd"


def ids_decoder(tokenizer: Any, skip_special_tokens: bool = True,
                spaces_between_special_tokens: bool = True) -> Callable[[list[int]], str]:
    """``tokenizer.decode`` with these options, as a function of the ids.

    NOTE: for a fast (Rust) tokenizer that does no clean-up of tokenization spaces, HF's decode
    is the backend's decode behind a Python wrapper (argument conversion, options) that costs
    about as much as the decode of a few ids itself; a streamed request decodes twice per step,
    so the backend is called directly there (``spaces_between_special_tokens`` only applies to
    slow tokenizers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (backend is not None and getattr(tokenizer, "is_fast", False)
            and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False):
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    kwargs = {"skip_special_tokens": skip_special_tokens,
              "spaces_between_special_tokens": spaces_between_special_tokens}
    return lambda ids: tokenizer.decode(ids, **kwargs)


class IncrementalDetokenizer:
    """Per-request text state: ``add(new_ids) -> delta``; ``flush() -> rest``; ``text``."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self._decode_ids = ids_decoder(tokenizer, skip_special_tokens,
                                       spaces_between_special_tokens)
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # everything emitted so far

    def _decode(self, ids: Sequence[int]) -> str:
        return self._decode_ids(list(ids)) if len(ids) else ""

    def add(self, token_ids: Sequence[int]) -> str:
        """Append new token ids; return the text they complete (possibly "")."""
        self.ids.extend(int(t) for t in token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        # NOTE: a trailing U+FFFD is (almost always) an incomplete UTF-8 character: hold it back.
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        delta = new_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of generation: emit what is still held back (even a lone U+FFFD)."""
        if self.read_offset == len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        delta = self._decode(self.ids[self.prefix_offset:])[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

"""Stop strings that may span several tokens.

Two halves, one per process:

- ``StopStringMatcher`` runs in the scheduler process after each step: it decodes only a tail
  window of the output ids, long enough to hold the longest stop string, and reports the stop
  string that appeared (the request then finishes with ``{"type": "stop", "matched": s}``).
- ``StopStringTrimmer`` runs where text is streamed (detokenizer / main process): it holds back
  any suffix of the text that could still grow into a stop string, so streamed text never shows
  part of a stop string, and trims the final text at the stop string (unless ``no_stop_trim``).

Typical streaming loop, with an ``IncrementalDetokenizer`` ``detok``::

    safe = trimmer.push(detok.add(new_ids))      # stream `safe`
    ...
    last = trimmer.finish(matched, tail=detok.flush())   # stream `last`; trimmer.text is final
"""
from __future__ import annotations

from typing import Any, Sequence

from .stop_regex import StopRegexTimeout, first_match, partial_start


def stop_window(stop: Sequence[str]) -> int:
    """Tokens of output tail that can hold any of ``stop``.

    NOTE: every token contributes at least one byte, so a stop string of B UTF-8 bytes overlaps at
    most B tokens; +2 covers a token that starts mid-character before it. Counting characters
    instead would miss multi-byte stops ("世界" is 2 characters but up to 6 byte-level tokens).
    """
    return max((len(s.encode("utf-8")) for s in stop if s), default=0) + 2


class StopStringMatcher:
    """``check(output_ids) -> matched stop string | None``, decoding a bounded tail window."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self._kwargs = {"skip_special_tokens": skip_special_tokens,
                        "spaces_between_special_tokens": spaces_between_special_tokens}
        self.window = stop_window(self.stop)

    def check(self, output_ids: Sequence[int], new_tokens: int = 1) -> str | None:
        """The stop string (earliest in the text) present in the tail of ``output_ids``.
        ``new_tokens``: tokens added since the last check (widens the window accordingly)."""
        if not self.stop or not len(output_ids):
            return None
        tail = list(output_ids[-(self.window + max(new_tokens, 1) - 1):])
        text = self.tokenizer.decode(tail, **self._kwargs)
        found = [(text.find(s), s) for s in self.stop if s in text]
        return min(found)[1] if found else None


class StopStringTrimmer:
    """Streaming holdback and final trimming of text at stop strings.

    ``text``: all text received so far, trimmed at the first stop string once one appeared.
    ``emitted``: what has been handed out by ``push``/``finish`` (always a prefix of ``text``).
    ``stop_regex``: patterns that stop like stop strings (see ``stop_regex.py``); text a pattern
    could still match is held back as well.
    """

    def __init__(self, stop: Sequence[str], no_stop_trim: bool = False,
                 stop_regex: Sequence[str] = ()) -> None:
        self.stop = tuple(s for s in stop if s)
        self.stop_regex = tuple(stop_regex)
        self.no_stop_trim = no_stop_trim
        self._buf = ""
        self._emitted = 0
        self._stop_at: int | None = None  # index in _buf where a stop string begins

    @property
    def text(self) -> str:
        return self._buf if self._stop_at is None else self._buf[: self._stop_at]

    @property
    def emitted(self) -> str:
        return self._buf[: self._emitted]

    @property
    def stopped(self) -> bool:
        """A full stop string has appeared in the text (nothing after it will be emitted)."""
        return self._stop_at is not None

    def push(self, delta: str) -> str:
        """Add decoded text; return the part that is safe to stream now."""
        if self._stop_at is not None or not delta:
            return ""
        self._buf += delta
        if not (self.stop or self.stop_regex) or self.no_stop_trim:
            return self._emit(len(self._buf))
        pos = self._find_stop(self._emitted)
        if pos is not None:
            self._stop_at = pos
            return self._emit(pos)
        held = partial_start(self._buf, self.stop_regex, self._emitted) if self.stop_regex \
            else len(self._buf)
        return self._emit(min(held, len(self._buf) - self._held_suffix()))

    def finish(self, matched: str | int | None = None, tail: str = "") -> str:
        """End of the request: ``tail`` is the detokenizer's last text, ``matched`` the stop
        string the scheduler saw (an int stop token id needs no text trimming). Returns the last
        piece to stream; afterwards ``text`` is the final text."""
        if self._stop_at is None:
            self._buf += tail
            if isinstance(matched, str) and matched in self.stop and not self.no_stop_trim:
                pos = self._buf.find(matched, self._emitted)
                self._stop_at = pos if pos >= 0 else None
            if self._stop_at is None and (self.stop or self.stop_regex) and not self.no_stop_trim:
                self._stop_at = self._find_stop(self._emitted)
        end = len(self._buf) if self._stop_at is None else self._stop_at
        return self._emit(end)

    def _emit(self, end: int) -> str:
        end = max(end, self._emitted)
        out = self._buf[self._emitted:end]
        self._emitted = end
        return out

    def _find_stop(self, start: int) -> int | None:
        # NOTE: searching from the emitted end suffices: emitted text never ends with a proper
        # prefix of a stop string, so no stop string can begin inside it.
        hits = [p for p in (self._buf.find(s, start) for s in self.stop) if p >= 0]
        regex_hit = None
        try:
            if self.stop_regex:
                regex_hit = first_match(self._buf, self.stop_regex, start)
        except StopRegexTimeout:  # the scheduler fails the request with that reason
            pass
        if regex_hit is not None:
            hits.append(regex_hit[0])
        return min(hits) if hits else None

    def _held_suffix(self) -> int:
        """Length of the longest suffix of the unemitted text that is a proper prefix of a stop."""
        pending = len(self._buf) - self._emitted
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, pending), best, -1):
                if self._buf.endswith(s[:k]):
                    best = k
                    break
        return best


def trim_at_stop(text: str, matched: str | None, no_stop_trim: bool = False,
                 stop_regex: Sequence[str] = ()) -> str:
    """Non-streaming final text: cut at the first occurrence of ``matched`` (a stop string, or
    one of ``stop_regex``: then at that pattern's first match)."""
    if not matched or no_stop_trim:
        return text
    if matched in stop_regex:
        try:
            hit = first_match(text, (matched,))
        except StopRegexTimeout:  # it matched within the scheduler's window: keep the text
            return text
        pos = hit[0] if hit is not None else -1
        if pos >= 0 or matched not in text:
            return text if pos < 0 else text[:pos]
    pos = text.find(matched)
    return text if pos < 0 else text[:pos]

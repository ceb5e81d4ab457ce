"""The output logprobs of an SGLang-native stream, chunk by chunk.

A streamed chunk's ``meta_info`` carries only that chunk's ``output_token_logprobs`` and
``output_top_logprobs`` plus ``output_token_logprobs_length``, the count of entries so far (this
runtime, and SGLang with ``--incremental-streaming-output``); SGLang's default mode sends all
entries so far. The length tells the two apart, so a client reads either: ``StreamLogprobs``
keeps every entry and gives each chunk's meta_info with only its new ones, and the whole list
for the final result (what a non-streamed call returns).
"""
from __future__ import annotations

from typing import Any

TOKENS, TOPS, LENGTH = "output_token_logprobs", "output_top_logprobs", "output_token_logprobs_length"


class StreamLogprobs:
    """Every output logprob entry of one stream so far (and their top alternatives)."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.tops: list[Any] | None = None  # None until a chunk carries top logprobs
        self.given = 0  # entries already handed out by ``chunk_meta``

    def add(self, meta: dict[str, Any]) -> None:
        """Keep the entries of ``meta`` (one chunk's meta_info) no earlier chunk carried."""
        if TOKENS not in meta:
            return
        entries = meta.get(TOKENS) or []
        total = int(meta.get(LENGTH, len(entries)))
        start = max(len(entries) - max(total - len(self.entries), 0), 0)
        self.entries.extend(entries[start:])
        tops = meta.get(TOPS)
        if tops is not None:
            if self.tops is None:
                self.tops = []
            self.tops.extend(tops[start:])

    def chunk_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        """``meta`` with the entries no earlier ``chunk_meta`` gave (a chunk passed over
        without text hands its entries to the next)."""
        self.add(meta)
        return self._with(meta, self.given)

    def complete(self, meta: dict[str, Any]) -> dict[str, Any]:
        """``meta`` (the last chunk's) with every entry of the stream, as a plain call's."""
        self.add(meta)
        return self._with(meta, 0)

    def _with(self, meta: dict[str, Any], start: int) -> dict[str, Any]:
        out = dict(meta)
        if TOKENS in meta:
            out[TOKENS] = self.entries[start:]
            out[LENGTH] = len(self.entries)
            if self.tops is not None:
                out[TOPS] = self.tops[start:]
            self.given = len(self.entries)
        return out

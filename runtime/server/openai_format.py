"""OpenAI response pieces built from engine outputs: finish reasons, usage, logprobs."""
from __future__ import annotations

from typing import Any, Sequence

Triple = Sequence[Any]  # [logprob | None, token_id, text | None], as the engine returns them


def finish_reason(meta: dict[str, Any]) -> str | None:
    """OpenAI's finish_reason for an engine ``finish_reason`` (None while running)."""
    fr = meta.get("finish_reason")
    if fr is None:
        return None
    kind = fr.get("type") if isinstance(fr, dict) else str(fr)
    return {"stop": "stop", "length": "length"}.get(kind, kind)


def usage(outputs: Sequence[dict[str, Any]], n: int) -> dict[str, Any]:
    """Usage of a fanned-out request: the prompt counted once per prompt (not per sample),
    completions summed over all samples."""
    metas = [o["meta_info"] for o in outputs]
    prompt = sum(m.get("prompt_tokens", 0) for m in metas[::n])
    cached = sum(m.get("cached_tokens", 0) for m in metas[::n])
    completion = sum(m.get("completion_tokens", 0) for m in metas)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _text(entry: Triple) -> str:
    return entry[2] if len(entry) > 2 and entry[2] is not None else ""


def completion_logprobs(entries: Sequence[Triple], tops: Sequence[Any] | None,
                        offset: int = 0) -> dict[str, Any]:
    """Legacy completions logprobs: parallel lists, top_logprobs as {token: logprob} maps,
    text offsets counted from ``offset``."""
    tokens, offsets, pos = [], [], offset
    for entry in entries:
        tokens.append(_text(entry))
        offsets.append(pos)
        pos += len(_text(entry))
    out: dict[str, Any] = {"tokens": tokens, "token_logprobs": [e[0] for e in entries],
                           "top_logprobs": None, "text_offset": offsets}
    if tops is not None:
        out["top_logprobs"] = [None if top is None else {_text(t): t[0] for t in top}
                               for top in tops]
    return out


def _chat_token(entry: Triple) -> dict[str, Any]:
    text = _text(entry)
    return {"token": text, "logprob": entry[0], "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[Triple], tops: Sequence[Any] | None) -> dict[str, Any]:
    """Chat logprobs: one object per token with its top alternatives."""
    content = []
    for i, entry in enumerate(entries):
        item = _chat_token(entry)
        top = tops[i] if tops is not None and i < len(tops) else None
        item["top_logprobs"] = [_chat_token(t) for t in top or []]
        content.append(item)
    return {"content": content}


class LogprobCursor:
    """Per sample, the logprob entries not yet sent, so streamed chunks carry only new ones.
    Engine chunks carry only theirs, with ``output_token_logprobs_length`` (the count so far);
    a chunk without the length is taken as cumulative."""

    def __init__(self, samples: int) -> None:
        self.seen = [0] * samples
        self.pending: list[tuple[list[Any], list[Any] | None]] = [([], None)] * samples

    def feed(self, index: int, meta: dict[str, Any]) -> None:
        """Keep the chunk's entries not seen yet for the next ``take`` (a chunk not sent)."""
        entries = list(meta.get("output_token_logprobs") or [])
        tops = meta.get("output_top_logprobs")
        total = int(meta.get("output_token_logprobs_length", len(entries)))
        start = max(len(entries) - max(total - self.seen[index], 0), 0)
        self.seen[index] = max(total, self.seen[index])
        kept, kept_tops = self.pending[index]
        new_tops = None if tops is None else (kept_tops or []) + list(tops[start:])
        self.pending[index] = (kept + entries[start:], new_tops)

    def take(self, index: int, meta: dict[str, Any]) -> tuple[list[Any], list[Any] | None]:
        """The entries to send with this chunk: those kept, then the chunk's new ones."""
        self.feed(index, meta)
        out, self.pending[index] = self.pending[index], ([], None)
        return out

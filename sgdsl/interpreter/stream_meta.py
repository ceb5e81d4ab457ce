"""A streaming gen's meta_info as chunks arrive, and the part of it new to one reader.

A runtime backend's streamed chunk carries its own output logprob entries (SGLang's streamed
meta_info). While a gen streams, ``meta_info[name]`` is the last chunk's meta_info with the
entries of every chunk so far; ``text_async_iter(name, return_meta_data=True)`` gives each
read the entries that arrived since the previous read, so the entries of the chunks a read
joins are all there (SGLang's frontend merges them the same way).
"""
from __future__ import annotations

from typing import Any, Mapping

TOKENS, TOPS, LENGTH = "output_token_logprobs", "output_top_logprobs", "output_token_logprobs_length"


def merge_chunk(live: dict[str, Any] | None, chunk: Mapping[str, Any]) -> dict[str, Any]:
    """A new meta_info: ``chunk``'s fields, with the logprob entries of ``live`` (the merge of
    the earlier chunks) followed by ``chunk``'s.

    NOTE: the entry lists are shared between successive merges and only grow (copying them
    per chunk would cost quadratic time); each merge's ``LENGTH`` says how many are its own,
    so a reader on another thread never sees entries of a later chunk."""
    out = dict(chunk)
    if TOKENS not in chunk:
        return out
    for key in (TOKENS, TOPS):
        if key in chunk:
            kept = live.get(key) if live is not None else None
            out[key] = kept if isinstance(kept, list) else []
            out[key].extend(chunk[key] or ())
    out[LENGTH] = len(out[TOKENS])
    return out


def since(meta: Mapping[str, Any] | None, seen: int) -> tuple[Any, int]:
    """``meta`` with only the logprob entries past the first ``seen``, and the new count."""
    if meta is None or TOKENS not in meta:
        return meta, seen
    end = int(meta.get(LENGTH, len(meta[TOKENS])))
    out = dict(meta)
    out[TOKENS] = list(meta[TOKENS][seen:end])
    if TOPS in meta and meta[TOPS] is not None:
        out[TOPS] = list(meta[TOPS][seen:end])
    out[LENGTH] = end
    return out, end

"""Logprobs of the model's raw logits (log-softmax before temperature or penalties), returned as
plain Python lists in the shape of ``docs/engine_api.md``: one entry per token is
``[logprob | None, token_id, text | None]``; the text slot stays None here (the scheduler process
has no tokenizer) and ``attach_text`` fills it in the main process on request.

Prompt logprobs: the logits row of prompt position ``j`` predicts the token at ``j + 1``. With
``logprob_start_len = k`` a request reports tokens at positions ``k .. L-1``; position 0 has no
logprob (None). Under chunked prefill each chunk reports the tokens its rows predict, and the
chunks' lists concatenate (``prompt_logprobs`` takes the chunk's first row position).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

Entry = list  # [logprob | None, token_id, text | None]


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-softmax over the vocabulary."""
    return torch.log_softmax(logits.float(), dim=-1)


def chosen_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor | Sequence[int]) -> list[Entry]:
    """``[lp, id, None]`` of one chosen token per row of ``logprobs`` ``[n, vocab]``."""
    ids = torch.as_tensor(token_ids, dtype=torch.int64, device=logprobs.device).reshape(-1, 1)
    values = logprobs.gather(1, ids).squeeze(1).tolist()
    return [[v, int(t), None] for v, t in zip(values, ids.squeeze(1).tolist())]


def top_logprobs(logprobs: torch.Tensor, nums: Sequence[int]) -> list[list[Entry]]:
    """Per row, the ``nums[row]`` most likely tokens as ``[lp, id, None]`` (most likely first).
    One ``topk`` for the whole batch at the largest k."""
    k = max(nums, default=0)
    if k <= 0:
        return [[] for _ in nums]
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    values, ids = values.tolist(), ids.tolist()
    return [[[v, t, None] for v, t in zip(values[r][:n], ids[r][:n])] for r, n in enumerate(nums)]


def output_logprobs(logits: torch.Tensor, next_ids: torch.Tensor,
                    top_nums: Sequence[int]) -> tuple[list[Entry], list[list[Entry]]]:
    """Logprob of each row's sampled token and its top-``top_nums[row]`` alternatives."""
    lp = log_softmax(logits)
    return chosen_logprobs(lp, next_ids), top_logprobs(lp, top_nums)


def prompt_logprobs(logits: torch.Tensor, input_ids: Sequence[int], start_len: int,
                    first_row_pos: int = 0, top_num: int = 0,
                    ) -> tuple[list[Entry], list[list[Entry] | None]]:
    """Prompt-token logprobs from ``logits`` rows for positions ``first_row_pos ..`` (one row per
    computed prompt position, e.g. one prefill chunk).

    Reports each token at position ``j`` with ``max(start_len, first_row_pos + 1) <= j <=
    first_row_pos + rows`` and ``j < len(input_ids)``, plus ``[None, input_ids[0], None]`` when
    ``start_len == 0`` and this chunk starts at position 0. Returns
    ``(input_token_logprobs, input_top_logprobs)``; the top list has None where the token has no
    logprob."""
    length = len(input_ids)
    tokens: list[Entry] = []
    tops: list[list[Entry] | None] = []
    if start_len == 0 and first_row_pos == 0 and length:
        tokens.append([None, int(input_ids[0]), None])
        tops.append(None)
    lo = max(start_len, first_row_pos + 1)
    hi = min(length - 1, first_row_pos + logits.shape[0])
    if lo > hi:
        return tokens, tops
    # NOTE: only the rows that predict reported tokens go through log-softmax.
    rows = log_softmax(logits[lo - 1 - first_row_pos: hi - first_row_pos])
    tokens += chosen_logprobs(rows, list(input_ids[lo: hi + 1]))
    tops += top_logprobs(rows, [top_num] * rows.shape[0]) if top_num > 0 else [[] for _ in range(
        rows.shape[0])]
    return tokens, tops


def attach_text(entries: Sequence[Any], decode: Callable[[int], str]) -> list[Any]:
    """Copy of ``entries`` (a list of entries, or of lists of entries, or None) with the text slot
    filled by ``decode(token_id)`` (e.g. ``lambda t: tokenizer.decode([t])``)."""
    out: list[Any] = []
    for item in entries:
        if item is None:
            out.append(None)
        elif item and isinstance(item[0], list):
            out.append(attach_text(item, decode))
        elif not item:
            out.append([])
        else:
            out.append([item[0], item[1], decode(int(item[1]))])
    return out
